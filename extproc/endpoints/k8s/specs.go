package k8s

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// target is what discovery selects: the pods matching selector, each
// serving every port. A nil selector selects nothing.
type target struct {
	selector labels.Selector
	ports    []int
}

// poolTarget reads an InferencePool's selector and ports. The API server
// validates pools against the CRD schema, but the checks are repeated so a
// pool written under a looser schema version cannot select the whole
// namespace or produce clashing ranks.
func poolTarget(p *inferencev1.InferencePool) (target, error) {
	set := make(labels.Set, len(p.Spec.Selector.MatchLabels))
	for k, v := range p.Spec.Selector.MatchLabels {
		set[string(k)] = string(v)
	}
	if len(set) == 0 {
		return target{}, errors.New("selector.matchLabels is empty")
	}
	sel, err := labels.ValidatedSelectorFromSet(set)
	if err != nil {
		return target{}, fmt.Errorf("selector.matchLabels: %w", err)
	}
	ports := make([]int, len(p.Spec.TargetPorts))
	for i, tp := range p.Spec.TargetPorts {
		ports[i] = int(tp.Number)
	}
	if ports, err = checkPorts(ports); err != nil {
		return target{}, fmt.Errorf("targetPorts: %w", err)
	}
	return target{selector: sel, ports: ports}, nil
}

// podRoutable reports whether a pod may receive traffic: it has an IP, is
// Ready and is not terminating. A terminating pod can still report Ready
// for its grace period, but new requests must not land on it.
func podRoutable(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// rankOf names the endpoint for a pod's i-th target port and places it:
// the pod itself when it serves one port, <pod>-rank-<i>, rank i of the
// pod, when it serves several.
func rankOf(pod string, i, nports int) (string, *endpoints.DataParallelRank) {
	if nports == 1 {
		return pod, nil
	}
	return endpoints.RankName(pod, i), &endpoints.DataParallelRank{Server: pod, Rank: i}
}

// skipped explains why a selected pod produced no endpoint.
type skipped struct {
	pod    string
	reason string
}

// specsFor turns the selected pods into the complete endpoint set, sorted
// by name. Pods that are not routable are left out silently (that is their
// normal state while starting or stopping); pods that cannot be routed for
// another reason are reported so the caller can log them.
func specsFor(pods []corev1.Pod, ports []int) ([]endpoints.Spec, []skipped) {
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	var (
		specs = make([]endpoints.Spec, 0, len(pods)*len(ports))
		skips []skipped
		// Two pods can briefly share an IP (host-network pods on one node,
		// or an address reused while the old pod's deletion has not reached
		// the cache). The datastore rejects a set with a duplicate address
		// whole, so the first pod by name keeps it and the other waits.
		owner = make(map[string]string, len(pods))
	)
	for i := range pods {
		p := &pods[i]
		if !podRoutable(p) {
			continue
		}
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || ip.Zone() != "" {
			skips = append(skips, skipped{p.Name, fmt.Sprintf("pod IP %q is not a routable address", p.Status.PodIP)})
			continue
		}
		addr0 := netip.AddrPortFrom(ip, uint16(ports[0])).String()
		if other, ok := owner[addr0]; ok {
			skips = append(skips, skipped{p.Name, fmt.Sprintf("address %s already belongs to pod %s", addr0, other)})
			continue
		}
		for r, port := range ports {
			addr := netip.AddrPortFrom(ip, uint16(port)).String()
			owner[addr] = p.Name
			name, dp := rankOf(p.Name, r, len(ports))
			specs = append(specs, endpoints.Spec{
				Name:         name,
				Address:      addr,
				Labels:       maps.Clone(p.Labels),
				NodeAddress:  p.Status.HostIP,
				DataParallel: dp,
			})
		}
	}
	slices.SortFunc(specs, func(a, b endpoints.Spec) int { return strings.Compare(a.Name, b.Name) })
	return specs, skips
}

// sameSpecs reports whether two sorted sets are identical, so that an event
// that changes nothing routable (a pod's annotation, a status heartbeat)
// does not reach the datastore.
func sameSpecs(a, b []endpoints.Spec) bool { return slices.EqualFunc(a, b, endpoints.SpecEqual) }

// trimPod is the pod informer's transform: the cache keeps only what
// discovery reads, which bounds its memory to a few hundred bytes per pod in
// the namespace whatever the pods' specs hold.
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	t := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:              p.Name,
			Namespace:         p.Namespace,
			UID:               p.UID,
			ResourceVersion:   p.ResourceVersion,
			Labels:            p.Labels,
			DeletionTimestamp: p.DeletionTimestamp,
		},
		Status: corev1.PodStatus{PodIP: p.Status.PodIP, HostIP: p.Status.HostIP},
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			t.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
			break
		}
	}
	return t, nil
}
