package endpoints

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"unicode"

	"k8s.io/apimachinery/pkg/util/validation"
)

// MaxNameLen bounds an endpoint name: a pod name (253) plus a rank suffix.
const MaxNameLen = 300

// SpecError reports which entry of a membership set is invalid and why, so
// that a source can point its operator at the offending line.
type SpecError struct {
	// Index is the entry's position in the set.
	Index int
	// Name is the entry's name, possibly empty.
	Name string
	// Field is the Spec field at fault, as spelled in the static file
	// ("name", "address", "metricsURL", "kvEvents", "kvEventsReplay",
	// "labels").
	Field string
	Err   error
}

func (e *SpecError) Error() string {
	return fmt.Sprintf("endpoints[%d] (name %q): %s: %v", e.Index, e.Name, e.Field, e.Err)
}

func (e *SpecError) Unwrap() error { return e.Err }

// Errors a SpecError wraps; callers can branch with errors.Is.
var (
	ErrDuplicate = errors.New("duplicate")
	ErrRequired  = errors.New("required")
)

// Validate checks a full membership set: every entry well formed, names and
// addresses unique. It returns the first problem as a *SpecError.
func Validate(specs []Spec) error {
	names := make(map[string]int, len(specs))
	addrs := make(map[addrKey]int, len(specs))
	for i, s := range specs {
		fail := func(field string, err error) error {
			return &SpecError{Index: i, Name: s.Name, Field: field, Err: err}
		}
		if err := validateName(s.Name); err != nil {
			return fail("name", err)
		}
		if j, ok := names[s.Name]; ok {
			return fail("name", fmt.Errorf("%w: also used by endpoints[%d]", ErrDuplicate, j))
		}
		names[s.Name] = i

		var err error
		if s.Hostname {
			err = ParseHostAddress(s.Address)
		} else {
			_, err = ParseAddress(s.Address)
		}
		if err != nil {
			return fail("address", err)
		}
		// Duplicates are judged by the datastore's index key, so that
		// two spellings of one address cannot both be members.
		k := keyOf(s.Address)
		if j, ok := addrs[k]; ok {
			return fail("address", fmt.Errorf("%w: %s also used by endpoints[%d]", ErrDuplicate, s.Address, j))
		}
		addrs[k] = i

		for k := range s.Labels {
			if k == "" {
				return fail("labels", errors.New("empty label key"))
			}
		}
		if s.MetricsURL != "" {
			if err := validateURL(s.MetricsURL, "http", "https"); err != nil {
				return fail("metricsURL", err)
			}
		}
		if s.KVEventsReplay != "" {
			if err := validateURL(s.KVEventsReplay, "tcp"); err != nil {
				return fail("kvEventsReplay", err)
			}
		}
		if s.KVEvents != "" {
			if err := validateURL(s.KVEvents, "tcp"); err != nil {
				return fail("kvEvents", err)
			}
		}
		if dp := s.DataParallel; dp != nil && (dp.Server == "" || dp.Rank < 0) {
			return fail("dataParallel", fmt.Errorf("server %q, rank %d: want a server and a rank of 0 or more", dp.Server, dp.Rank))
		}
	}
	return nil
}

// ParseAddress parses an endpoint address, which must be a literal ip:port
// (IPv6 in brackets): the proxy dials it without name resolution.
func ParseAddress(addr string) (netip.AddrPort, error) {
	if addr == "" {
		return netip.AddrPort{}, ErrRequired
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("want ip:port: %w", err)
	}
	if ap.Port() == 0 {
		return netip.AddrPort{}, fmt.Errorf("%q: port must be 1-65535", addr)
	}
	if ap.Addr().Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("%q: zoned IPv6 addresses are not routable by the proxy", addr)
	}
	return ap, nil
}

func validateName(name string) error {
	switch {
	case name == "":
		return ErrRequired
	case len(name) > MaxNameLen:
		return fmt.Errorf("longer than %d bytes", MaxNameLen)
	}
	// Names end up in headers, logs and metric labels: keep them printable
	// and free of separators.
	for _, r := range name {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) || r == ',' {
			return fmt.Errorf("%q: whitespace, commas and control characters are not allowed", name)
		}
	}
	return nil
}

func validateURL(raw string, schemes ...string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	ok := false
	for _, s := range schemes {
		ok = ok || u.Scheme == s
	}
	if !ok {
		return fmt.Errorf("%q: scheme must be %s", raw, strings.Join(schemes, " or "))
	}
	if u.Hostname() == "" {
		return fmt.Errorf("%q: missing host", raw)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%q: port must be 1-65535", raw)
		}
	} else if u.Scheme == "tcp" {
		return fmt.Errorf("%q: missing port", raw)
	}
	return nil
}

// ParseHostAddress checks a Spec.Hostname address: host:port where host is
// a literal IP or a DNS-1123 subdomain (lower case) and port 1-65535.
func ParseHostAddress(addr string) error {
	if addr == "" {
		return ErrRequired
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port: %w", err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port must be 1-65535", addr)
	}
	if net.ParseIP(host) != nil {
		_, err := ParseAddress(addr)
		return err
	}
	if errs := validation.IsDNS1123Subdomain(host); len(errs) > 0 {
		return fmt.Errorf("%q: host is neither an IP nor a DNS name: %s", addr, strings.Join(errs, "; "))
	}
	return nil
}
