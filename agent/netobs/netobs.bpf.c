//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// kvgate netobs: per-connection TCP RTT, retransmits and bytes acked for
// the flows whose ports fall in a configured class, from a sockops
// program on a cgroup v2 (no kprobes or fentry: they are not available on
// every node). The loader (tracker.go) reads the flow map every poll and
// deletes the entries of closed flows once their last values are counted.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define AF_INET 2
#define AF_INET6 10

// Sized by the loader (MaxFlows); this is the default.
#define MAX_FLOWS 16384

struct flow_key {
	__u32 family;
	__u32 lport; // host order
	__u32 rport; // host order
	__u32 laddr[4]; // network order (IPv4: laddr[0])
	__u32 raddr[4];
};

struct flow {
	__u64 srtt_us;
	__u64 min_rtt_us;
	__u64 rtt_samples;
	__u64 bytes_acked;
	__u64 bytes_received;
	__u64 updated_ns;
	__u32 retrans;
	__u32 class_id;
	__u32 closed;
	__u32 active; // this side connected (1) or accepted (0)
};

// A flow's value only changes in its socket's callbacks; the loader reads
// it while it may change, which at worst shows one sample late.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_FLOWS);
	__type(key, struct flow_key);
	__type(value, struct flow);
} flows SEC(".maps");

// port -> class id (0: not tracked), written by the loader.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u32);
} port_class SEC(".maps");

enum {
	STAT_OPENED = 0, // flows inserted
	STAT_EVENTS = 1, // callbacks that updated a flow
	STAT_MISSED = 2, // callbacks of a tracked socket whose entry was gone (evicted)
	STAT_MAX = 3,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);
	if (v)
		*v += 1;
}

static __always_inline __u32 class_of(__u32 port)
{
	__u32 *c = bpf_map_lookup_elem(&port_class, &port);
	return c ? *c : 0;
}

static __always_inline int key_of(struct bpf_sock_ops *skops, struct flow_key *k)
{
	k->family = skops->family;
	k->lport = skops->local_port;
	k->rport = bpf_ntohl(skops->remote_port);
	if (skops->family == AF_INET) {
		k->laddr[0] = skops->local_ip4;
		k->raddr[0] = skops->remote_ip4;
		return 0;
	}
	if (skops->family == AF_INET6) {
		k->laddr[0] = skops->local_ip6[0];
		k->laddr[1] = skops->local_ip6[1];
		k->laddr[2] = skops->local_ip6[2];
		k->laddr[3] = skops->local_ip6[3];
		k->raddr[0] = skops->remote_ip6[0];
		k->raddr[1] = skops->remote_ip6[1];
		k->raddr[2] = skops->remote_ip6[2];
		k->raddr[3] = skops->remote_ip6[3];
		return 0;
	}
	return -1;
}

static __always_inline void fill(struct bpf_sock_ops *skops, struct flow *f)
{
	f->srtt_us = skops->srtt_us >> 3; // the kernel keeps srtt << 3
	f->min_rtt_us = skops->rtt_min;
	f->bytes_acked = skops->bytes_acked;
	f->bytes_received = skops->bytes_received;
	f->retrans = skops->total_retrans;
	f->updated_ns = bpf_ktime_get_ns();
}

SEC("sockops")
int kvgate_sockops(struct bpf_sock_ops *skops)
{
	struct flow_key k = {};
	struct flow *f;
	__u32 op = skops->op;

	switch (op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB: {
		if (key_of(skops, &k))
			return 1;
		// The listening side is known by its own port, the connecting
		// side by the port it dialled: ephemeral ports never decide.
		int active = op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB;
		__u32 cls = class_of(active ? k.rport : k.lport);
		if (!cls)
			return 1;
		struct flow nf = {};
		fill(skops, &nf);
		nf.class_id = cls;
		nf.active = active;
		bpf_map_update_elem(&flows, &k, &nf, BPF_ANY);
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTT_CB_FLAG |
						  BPF_SOCK_OPS_RETRANS_CB_FLAG | BPF_SOCK_OPS_STATE_CB_FLAG);
		count(STAT_OPENED);
		return 1;
	}
	case BPF_SOCK_OPS_RTT_CB:
	case BPF_SOCK_OPS_RETRANS_CB:
	case BPF_SOCK_OPS_STATE_CB:
		break;
	default:
		return 1;
	}
	if (key_of(skops, &k))
		return 1;
	f = bpf_map_lookup_elem(&flows, &k);
	if (!f) {
		count(STAT_MISSED);
		return 1;
	}
	// STATE_CB: args[1] is the new state; the loader deletes the flow
	// once it has counted it closed.
	if (op == BPF_SOCK_OPS_STATE_CB && skops->args[1] == BPF_TCP_CLOSE)
		f->closed = 1;
	fill(skops, f);
	if (op == BPF_SOCK_OPS_RTT_CB) {
		// args[1] is the srtt the sample just produced (<< 3): the
		// socket's field may not hold it yet.
		f->srtt_us = skops->args[1] >> 3;
		__sync_fetch_and_add(&f->rtt_samples, 1);
	}
	count(STAT_EVENTS);
	return 1;
}

char _license[] SEC("license") = "Dual BSD/GPL";
