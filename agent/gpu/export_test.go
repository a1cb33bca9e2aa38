package gpu

// PodOfForTest exposes podOf to the external tests.
func PodOfForTest(procRoot string, pid uint32) (string, []string) {
	p := podOf(procRoot, pid)
	return p.uid, p.ips
}
