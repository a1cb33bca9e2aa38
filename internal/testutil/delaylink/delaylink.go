package delaylink

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Options shape the link.
type Options struct {
	// Delay is added to every packet from A to B.
	Delay time.Duration
	// DropEvery > 0 drops every Nth data-carrying TCP segment from A to B.
	DropEvery int
	// Queue bounds the packets in flight in the forwarder (default 8192);
	// a packet that finds it full is dropped and counted.
	Queue int
}

// Link is a running pair of namespaces.
type Link struct {
	// A and B are the namespaces' names (ip netns).
	A, B string
	// AddrA and AddrB are their veth addresses.
	AddrA, AddrB netip.Addr

	tun       *os.File
	pkt       int // AF_PACKET socket in A
	ll        unix.SockaddrLinklayer
	queue     chan packet
	opts      Options
	done      chan struct{}
	forwarded atomic.Uint64
	dropped   atomic.Uint64
	seen      uint64 // data segments, forwarder goroutine only
}

type packet struct {
	due  time.Time
	data []byte
}

var seq atomic.Uint32

// New creates the namespaces, the veth pair and the forwarder. It skips
// the test when not root.
func New(tb testing.TB, opts Options) *Link {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("delaylink needs root (network namespaces and TUN); make test runs as root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Fatalf("iproute2's ip is needed: %v", err)
	}
	if opts.Queue <= 0 {
		opts.Queue = 8192
	}
	id := fmt.Sprintf("%d%d", os.Getpid()%100000, seq.Add(1))
	l := &Link{A: "kvdlA" + id, B: "kvdlB" + id, AddrA: netip.MustParseAddr("10.231.0.1"),
		AddrB: netip.MustParseAddr("10.231.0.2"), opts: opts, queue: make(chan packet, opts.Queue), done: make(chan struct{})}
	va, vb, tun := "kvda"+id, "kvdb"+id, "kvdt"+id
	tb.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", l.A).Run()
		_ = exec.Command("ip", "netns", "del", l.B).Run()
	})
	run := func(args ...string) {
		tb.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			tb.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", l.A)
	run("netns", "add", l.B)
	run("link", "add", va, "type", "veth", "peer", "name", vb)
	run("link", "set", va, "netns", l.A)
	run("link", "set", vb, "netns", l.B)
	run("-n", l.A, "addr", "add", l.AddrA.String()+"/24", "dev", va)
	run("-n", l.B, "addr", "add", l.AddrB.String()+"/24", "dev", vb)
	for _, ns := range [][2]string{{l.A, va}, {l.B, vb}} {
		run("-n", ns[0], "link", "set", "lo", "up")
		run("-n", ns[0], "link", "set", ns[1], "up")
	}
	f, err := openTUN(tun)
	if err != nil {
		tb.Fatal(err)
	}
	l.tun = f
	run("link", "set", tun, "netns", l.A)
	run("-n", l.A, "link", "set", tun, "up")
	run("-n", l.A, "route", "add", l.AddrB.String()+"/32", "dev", tun, "src", l.AddrA.String())
	// Replies from B arrive on the veth while the route to B is the TUN:
	// strict reverse-path filtering would drop them.
	for _, k := range []string{"all", "default", va} {
		if err := l.Do(l.A, func() error {
			return os.WriteFile("/proc/sys/net/ipv4/conf/"+k+"/rp_filter", []byte("0"), 0o644)
		}); err != nil {
			tb.Fatalf("rp_filter: %v", err)
		}
	}
	var dst net.HardwareAddr
	if err := l.Do(l.B, func() error {
		ifc, err := net.InterfaceByName(vb)
		if err == nil {
			dst = ifc.HardwareAddr
		}
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	if err := l.Do(l.A, func() error {
		ifc, err := net.InterfaceByName(va)
		if err != nil {
			return err
		}
		// Protocol 0: a send-only packet socket, it receives nothing.
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		l.pkt = fd
		l.ll = unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifc.Index, Halen: 6}
		copy(l.ll.Addr[:], dst)
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); l.read() }()
	go func() { defer wg.Done(); l.write() }()
	tb.Cleanup(func() {
		l.tun.Close() // ends read, which closes the queue and so write
		wg.Wait()
		unix.Close(l.pkt)
	})
	return l
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// openTUN creates a TUN device (no packet information header), its file
// non-blocking so that Close ends a pending Read.
func openTUN(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	var req [unix.IFNAMSIZ + 64]byte
	copy(req[:], name)
	*(*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ])) = unix.IFF_TUN | unix.IFF_NO_PI
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0]))); e != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, e)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}

// Do runs fn on an OS thread inside namespace ns: sockets fn creates
// belong to ns and stay usable from anywhere afterwards.
func (l *Link) Do(ns string, fn func() error) error {
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		return err
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// The thread stays in ns: keep it locked so that it exits
			// with this goroutine instead of serving others.
			errc <- errors.Join(ferr, fmt.Errorf("setns back: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Listen listens on addr inside ns.
func (l *Link) Listen(ns, addr string) (net.Listener, error) {
	var ln net.Listener
	err := l.Do(ns, func() (err error) { ln, err = net.Listen("tcp4", addr); return })
	return ln, err
}

// Dial connects from inside ns.
func (l *Link) Dial(ns, addr string) (net.Conn, error) {
	var c net.Conn
	err := l.Do(ns, func() (err error) { c, err = net.DialTimeout("tcp4", addr, 10*time.Second); return })
	return c, err
}

// Exec runs a command inside ns and returns its combined output.
func (l *Link) Exec(ns string, name string, args ...string) ([]byte, error) {
	return exec.Command("ip", append([]string{"netns", "exec", ns, name}, args...)...).CombinedOutput()
}

// Forwarded and Dropped count packets from A to B.
func (l *Link) Forwarded() uint64 { return l.forwarded.Load() }
func (l *Link) Dropped() uint64   { return l.dropped.Load() }

func (l *Link) read() {
	defer close(l.queue)
	buf := make([]byte, 65536)
	for {
		n, err := l.tun.Read(buf)
		if err != nil {
			return
		}
		if l.drop(buf[:n]) {
			l.dropped.Add(1)
			continue
		}
		p := packet{due: time.Now().Add(l.opts.Delay), data: append([]byte(nil), buf[:n]...)}
		select {
		case l.queue <- p:
		default:
			l.dropped.Add(1)
		}
	}
}

// drop decides DropEvery for one IPv4 packet.
func (l *Link) drop(p []byte) bool {
	if l.opts.DropEvery <= 0 || len(p) < 20 || p[0]>>4 != 4 || p[9] != unix.IPPROTO_TCP {
		return false
	}
	ihl := int(p[0]&0x0f) * 4
	total := int(p[2])<<8 | int(p[3])
	if len(p) < ihl+20 || total > len(p) {
		return false
	}
	doff := int(p[ihl+12]>>4) * 4
	if total-ihl-doff <= 0 {
		return false // SYN, pure ACK, FIN: dropping those only stalls the test
	}
	l.seen++
	return l.seen%uint64(l.opts.DropEvery) == 0
}

func (l *Link) write() {
	for p := range l.queue {
		if d := time.Until(p.due); d > 0 {
			time.Sleep(d)
		}
		if err := unix.Sendto(l.pkt, p.data, 0, &l.ll); err != nil {
			l.dropped.Add(1)
			continue
		}
		l.forwarded.Add(1)
	}
}

// Echo serves ln until it is closed: each connection gets its bytes back.
// The returned wait blocks until the listener and every connection ended.
func Echo(ln net.Listener) (wait func()) {
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			})
		}
	})
	return wg.Wait
}
