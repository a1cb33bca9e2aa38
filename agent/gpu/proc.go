package gpu

import (
	"bufio"
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// pod is what a GPU process's /proc entries say of its pod.
type pod struct {
	uid string
	ips []string
}

// podUID matches the pod segment of a kubelet cgroup path, in both
// drivers' spellings: cgroupfs ".../pod<uid>/<container>" and systemd
// ".../kubepods-burstable-pod<uid with _>.slice/...".
var podUID = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// podOf reads process pid's pod UID from its cgroup and, when it lives in
// a network namespace other than the agent's own, that namespace's local
// IPv4 addresses (the pod IP). Missing or unreadable entries give less,
// never an error: processes come and go between NVML's list and here.
func podOf(procRoot string, pid uint32) pod {
	dir := filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10))
	var p pod
	if b, err := os.ReadFile(filepath.Join(dir, "cgroup")); err == nil {
		if m := podUID.FindSubmatch(b); m != nil {
			p.uid = strings.ReplaceAll(string(m[1]), "_", "-")
		}
	}
	self, err1 := os.Readlink(filepath.Join(procRoot, "self", "ns", "net"))
	their, err2 := os.Readlink(filepath.Join(dir, "ns", "net"))
	if err1 != nil || err2 != nil || self == their {
		return p
	}
	if b, err := os.ReadFile(filepath.Join(dir, "net", "fib_trie")); err == nil {
		p.ips = localAddrs(b)
	}
	return p
}

// localAddrs parses /proc/net/fib_trie: an address line ("|-- 10.1.2.3")
// followed by "/32 host LOCAL" is one of the namespace's own addresses.
// Loopback addresses are left out.
func localAddrs(fibTrie []byte) []string {
	var out []string
	var last string
	sc := bufio.NewScanner(bytes.NewReader(fibTrie))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if a, ok := strings.CutPrefix(line, "|-- "); ok {
			last = a
			continue
		}
		if line != "/32 host LOCAL" || last == "" {
			continue
		}
		ip, err := netip.ParseAddr(last)
		last = ""
		if err != nil || ip.IsLoopback() {
			continue
		}
		s := ip.String()
		found := false
		for _, o := range out {
			found = found || o == s
		}
		if !found {
			out = append(out, s)
		}
	}
	return out
}
