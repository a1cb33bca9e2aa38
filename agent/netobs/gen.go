package netobs

// `make bpf` regenerates netobs_bpfel.go and netobs_bpfel.o (clang,
// libbpf-dev, linux-libc-dev); both are committed, so building needs no
// clang. BPF_INCLUDE is the multiarch include folder (asm/types.h).
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I$BPF_INCLUDE" -target bpfel -type flow_key -type flow netobs netobs.bpf.c
