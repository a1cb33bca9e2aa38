package netobs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// flowEntry is one element of the flow map.
type flowEntry struct {
	key flowKey
	val netobsFlow
}

// bpfSource owns the loaded programs, maps and the cgroup link.
type bpfSource struct {
	objs  netobsObjects
	link  link.Link
	keys  []flowKey
	vals  []netobsFlow
	out   []flowEntry
	batch bool // the kernel supports batch lookups on the flow map
}

// batchChunk is the flow map's read batch: above a hash bucket's size
// (the kernel refuses smaller batches with ENOSPC) and a few syscalls for
// a full default map.
const batchChunk = 4096

// DefaultCgroupPath is the cgroup v2 mount: the hybrid layout's
// /sys/fs/cgroup/unified, else /sys/fs/cgroup.
func DefaultCgroupPath() string {
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(p, "cgroup.controllers")); err == nil {
			return p
		}
	}
	return "/sys/fs/cgroup/unified"
}

// Attach loads the sockops program and attaches it to the cgroup. The
// sockets of flows established before it are not seen. An error wraps
// ErrUnavailable when the kernel or permissions do not allow it.
func (t *Tracker) Attach() error {
	if t.bpf != nil {
		return nil
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("%w: memlock rlimit: %w", ErrUnavailable, err)
	}
	spec, err := loadNetobs()
	if err != nil {
		return fmt.Errorf("netobs: embedded BPF object: %w", err)
	}
	spec.Maps["flows"].MaxEntries = uint32(t.cfg.MaxFlows)
	s := &bpfSource{}
	if err := spec.LoadAndAssign(&s.objs, nil); err != nil {
		return fmt.Errorf("%w: loading the sockops program: %w", ErrUnavailable, err)
	}
	var ports, classes []uint32
	for p, c := range t.ports {
		if c != 0 {
			ports = append(ports, uint32(p))
			classes = append(classes, c)
		}
	}
	if _, err := s.objs.PortClass.BatchUpdate(ports, classes, nil); err != nil {
		for i, p := range ports { // kernels without batch updates on arrays
			if err := s.objs.PortClass.Put(p, classes[i]); err != nil {
				s.objs.Close()
				return fmt.Errorf("netobs: port classes: %w", err)
			}
		}
	}
	path := t.cfg.CgroupPath
	if path == "" {
		path = DefaultCgroupPath()
	}
	s.link, err = link.AttachCgroup(link.CgroupOptions{Path: path, Attach: ebpf.AttachCGroupSockOps, Program: s.objs.KvgateSockops})
	if err != nil {
		s.objs.Close()
		return fmt.Errorf("%w: attaching sockops to cgroup %s: %w", ErrUnavailable, path, err)
	}
	n := min(batchChunk, t.cfg.MaxFlows)
	s.keys, s.vals, s.batch = make([]flowKey, n), make([]netobsFlow, n), true
	t.bpf = s
	t.log.Info("eBPF network tracking attached", "cgroup", path, "max_flows", t.cfg.MaxFlows, "classes", t.classes)
	return nil
}

// read returns every flow in the map (the slice is reused by the next read).
func (s *bpfSource) read() ([]flowEntry, error) {
	s.out = s.out[:0]
	if s.batch {
		var cur ebpf.MapBatchCursor
		for {
			n, err := s.objs.Flows.BatchLookup(&cur, s.keys, s.vals, nil)
			for i := range n {
				s.out = append(s.out, flowEntry{s.keys[i], s.vals[i]})
			}
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return s.out, nil
			}
			if errors.Is(err, ebpf.ErrNotSupported) {
				s.batch = false
				s.out = s.out[:0]
				break
			}
			if err != nil {
				return nil, err
			}
		}
	}
	var e flowEntry
	it := s.objs.Flows.Iterate()
	for it.Next(&e.key, &e.val) {
		s.out = append(s.out, e)
	}
	return s.out, it.Err()
}

// remove deletes closed flows; one already gone is no error.
func (s *bpfSource) remove(keys []flowKey) {
	if len(keys) == 0 {
		return
	}
	if _, err := s.objs.Flows.BatchDelete(keys, nil); err == nil {
		return
	}
	for i := range keys {
		_ = s.objs.Flows.Delete(&keys[i])
	}
}

// stats sums the per-CPU counters of the program.
func (s *bpfSource) stats() (opened, events, missed uint64) {
	sum := func(idx uint32) uint64 {
		var per []uint64
		if err := s.objs.Stats.Lookup(idx, &per); err != nil {
			return 0
		}
		var n uint64
		for _, v := range per {
			n += v
		}
		return n
	}
	return sum(0), sum(1), sum(2)
}

// runStats are the program's run count and time (kernel.bpf_stats_enabled).
func (s *bpfSource) runStats() (*ebpf.ProgramStats, error) { return s.objs.KvgateSockops.Stats() }

func (s *bpfSource) close() error {
	return errors.Join(s.link.Close(), s.objs.Close())
}
