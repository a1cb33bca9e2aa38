package endpoints

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

func names(eps []*Endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.Name()
	}
	return out
}

func spec(name, addr string, labels ...string) Spec {
	s := Spec{Name: name, Address: addr}
	if len(labels) > 0 {
		s.Labels = map[string]string{}
		for i := 0; i+1 < len(labels); i += 2 {
			s.Labels[labels[i]] = labels[i+1]
		}
	}
	return s
}

type recorder struct {
	mu      sync.Mutex
	changes []Change
}

func (r *recorder) EndpointsChanged(c Change) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes = append(r.changes, c)
}

func TestReplaceKeepsUnchangedEndpoints(t *testing.T) {
	d := NewDatastore()
	rec := &recorder{}
	d.Subscribe(rec)

	if err := d.Replace([]Spec{
		spec("b", "10.0.0.2:8000", RoleLabel, "decode"),
		spec("a", "10.0.0.1:8000"),
		spec("c", "10.0.0.3:8000"),
	}); err != nil {
		t.Fatal(err)
	}
	a, b, c := d.Get("a"), d.Get("b"), d.Get("c")
	a.SetMetrics(&Metrics{WaitingQueueSize: 7, UpdateTime: time.Unix(1, 0)})
	a.Charge(0, 0, 0, 50)
	a.Charge(0, 0, 0, 50)
	d.SetHealthy(c, false)

	// a unchanged, b's labels change, c unchanged, d new.
	if err := d.Replace([]Spec{
		spec("a", "10.0.0.1:8000"),
		spec("b", "10.0.0.2:8000", RoleLabel, "prefill"),
		spec("c", "10.0.0.3:8000"),
		spec("d", "10.0.0.4:8000"),
	}); err != nil {
		t.Fatal(err)
	}
	if d.Get("a") != a || a.Metrics().WaitingQueueSize != 7 || a.InflightRequests() != 2 {
		t.Errorf("unchanged endpoint a lost its state")
	}
	if d.Get("b") == b || d.Get("b").Label(RoleLabel) != "prefill" {
		t.Errorf("changed endpoint b was not replaced")
	}
	if d.Get("c") != c || d.Healthy(c) {
		t.Errorf("unchanged endpoint c lost its unhealthy mark")
	}
	if got, want := names(d.All()), []string{"a", "b", "c", "d"}; !slices.Equal(got, want) {
		t.Errorf("All = %v, want %v", got, want)
	}
	if got, want := names(d.Candidates()), []string{"a", "b", "d"}; !slices.Equal(got, want) {
		t.Errorf("Candidates = %v, want %v", got, want)
	}
	if d.ByAddress("10.0.0.4:8000") != d.Get("d") || d.ByAddress("10.0.0.9:1") != nil {
		t.Errorf("ByAddress mismatch")
	}

	want := []struct{ added, removed []string }{
		{[]string{"a", "b", "c"}, nil},
		{[]string{"b", "d"}, []string{"b"}},
	}
	if len(rec.changes) != len(want) {
		t.Fatalf("got %d changes, want %d", len(rec.changes), len(want))
	}
	for i, w := range want {
		got := rec.changes[i]
		if !slices.Equal(names(got.Added), w.added) || !slices.Equal(names(got.Removed), w.removed) {
			t.Errorf("change %d = +%v -%v, want +%v -%v", i, names(got.Added), names(got.Removed), w.added, w.removed)
		}
	}
	if rec.changes[1].Removed[0] != b {
		t.Errorf("removed endpoint is not the old value")
	}

	// An identical set is not a change.
	if err := d.Replace(specsOf(d.All())); err != nil {
		t.Fatal(err)
	}
	if len(rec.changes) != 2 {
		t.Errorf("identical Replace notified listeners")
	}
}

func specsOf(eps []*Endpoint) []Spec {
	out := make([]Spec, len(eps))
	for i, e := range eps {
		out[i] = e.Spec()
	}
	return out
}

func TestReplaceRejectsInvalidSetWhole(t *testing.T) {
	d := NewDatastore()
	good := []Spec{spec("a", "10.0.0.1:8000")}
	if err := d.Replace(good); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		specs []Spec
		field string
		is    error
	}{
		{"duplicate name", []Spec{spec("x", "10.0.0.1:1"), spec("x", "10.0.0.2:1")}, "name", ErrDuplicate},
		{"duplicate address", []Spec{spec("x", "10.0.0.1:1"), spec("y", "10.0.0.1:1")}, "address", ErrDuplicate},
		{"duplicate ipv6 address spelled differently", []Spec{spec("x", "[::1]:80"), spec("y", "[0::1]:80")}, "address", ErrDuplicate},
		{"empty name", []Spec{spec("", "10.0.0.1:1")}, "name", ErrRequired},
		{"empty address", []Spec{spec("x", "")}, "address", ErrRequired},
		{"hostname", []Spec{spec("x", "pod-a:8000")}, "address", nil},
		{"no port", []Spec{spec("x", "10.0.0.1")}, "address", nil},
		{"port zero", []Spec{spec("x", "10.0.0.1:0")}, "address", nil},
		{"bad metrics url", []Spec{{Name: "x", Address: "10.0.0.1:1", MetricsURL: "ftp://h/metrics"}}, "metricsURL", nil},
		{"kv events without port", []Spec{{Name: "x", Address: "10.0.0.1:1", KVEvents: "tcp://10.0.0.1"}}, "kvEvents", nil},
		{"empty label key", []Spec{{Name: "x", Address: "10.0.0.1:1", Labels: map[string]string{"": "v"}}}, "labels", nil},
		{"name with space", []Spec{spec("a b", "10.0.0.1:1")}, "name", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := d.Replace(tt.specs)
			var se *SpecError
			if !errors.As(err, &se) || se.Field != tt.field {
				t.Fatalf("err = %v, want SpecError on field %q", err, tt.field)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("err = %v, want errors.Is %v", err, tt.is)
			}
			if got := names(d.All()); !slices.Equal(got, []string{"a"}) {
				t.Errorf("membership changed to %v after rejected set", got)
			}
		})
	}
}

func TestSetHealthy(t *testing.T) {
	d := NewDatastore()
	if err := d.Replace([]Spec{spec("a", "10.0.0.1:1"), spec("b", "10.0.0.2:1")}); err != nil {
		t.Fatal(err)
	}
	a := d.Get("a")
	d.SetHealthy(a, false)
	if got := names(d.Candidates()); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("Candidates = %v", got)
	}
	if len(d.All()) != 2 {
		t.Fatalf("unhealthy endpoint left All")
	}
	d.SetHealthy(a, true)
	if got := names(d.Candidates()); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("Candidates = %v", got)
	}

	// A removed endpoint's late health report must not bring it back.
	if err := d.Replace([]Spec{spec("b", "10.0.0.2:1")}); err != nil {
		t.Fatal(err)
	}
	d.SetHealthy(a, true)
	d.SetHealthy(a, false)
	if got := names(d.Candidates()); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("Candidates = %v", got)
	}
}

func TestCandidatesSliceIsNotClobberedByAppend(t *testing.T) {
	d := NewDatastore()
	if err := d.Replace([]Spec{spec("a", "10.0.0.1:1"), spec("b", "10.0.0.2:1")}); err != nil {
		t.Fatal(err)
	}
	c := d.Candidates()
	_ = append(c, NewEndpoint(spec("z", "10.0.0.9:1")))
	if got := names(d.Candidates()); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("Candidates = %v after a caller's append", got)
	}
}

func TestSubscribeReplaysCurrentMembershipAndUnsubscribes(t *testing.T) {
	d := NewDatastore()
	if err := d.Replace([]Spec{spec("a", "10.0.0.1:1")}); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	unsub := d.Subscribe(rec)
	if len(rec.changes) != 1 || !slices.Equal(names(rec.changes[0].Added), []string{"a"}) {
		t.Fatalf("late subscriber got %v", rec.changes)
	}
	unsub()
	if err := d.Replace(nil); err != nil {
		t.Fatal(err)
	}
	if len(rec.changes) != 1 {
		t.Fatalf("unsubscribed listener was called")
	}
}

// Concurrent writers and readers: run under -race. Listener calls must be
// serial and each must match a state the readers could observe.
func TestConcurrentReplaceAndRead(t *testing.T) {
	d := NewDatastore()
	var inCall sync.Mutex
	d.Subscribe(ListenerFunc(func(Change) {
		if !inCall.TryLock() {
			t.Error("listener called concurrently")
			return
		}
		inCall.Unlock()
	}))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 2 {
		wg.Go(func() {
			for i := range 200 {
				n := 1 + (i+w)%5
				specs := make([]Spec, n)
				for j := range n {
					specs[j] = spec(fmt.Sprintf("ep-%d", j), fmt.Sprintf("10.0.0.%d:8000", j+1))
				}
				if err := d.Replace(specs); err != nil {
					t.Error(err)
				}
				if e := d.Get("ep-0"); e != nil {
					d.SetHealthy(e, i%2 == 0)
				}
			}
		})
	}
	var readers sync.WaitGroup
	readers.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			// Any snapshot a reader sees is internally consistent.
			for _, e := range d.Candidates() {
				if e.Name() == "" || e.Address() == "" {
					t.Error("torn endpoint")
				}
			}
			_ = d.ByAddress("10.0.0.1:8000")
		}
	})
	wg.Wait()
	close(stop)
	readers.Wait()
}

func BenchmarkCandidates(b *testing.B) {
	for _, n := range []int{16, 1024} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			d := NewDatastore()
			specs := make([]Spec, n)
			for i := range n {
				specs[i] = spec(fmt.Sprintf("ep-%04d", i), fmt.Sprintf("10.%d.%d.%d:8000", i>>16&255, i>>8&255, i&255))
			}
			if err := d.Replace(specs); err != nil {
				b.Fatal(err)
			}
			d.SetHealthy(d.Get("ep-0003"), false)
			b.ReportAllocs()
			var sink int
			for b.Loop() {
				sink += len(d.Candidates())
			}
			if sink == 0 {
				b.Fatal("no candidates")
			}
		})
	}
}

func BenchmarkReplace(b *testing.B) {
	const n = 1024
	specs := make([]Spec, n)
	for i := range n {
		specs[i] = spec(fmt.Sprintf("ep-%04d", i), fmt.Sprintf("10.0.%d.%d:8000", i>>8, i&255), RoleLabel, "decode")
	}
	d := NewDatastore()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		// Alternate one changed address so each call does real work.
		i++
		specs[0].Address = fmt.Sprintf("10.1.0.%d:8000", i&1+1)
		if err := d.Replace(specs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n), "endpoints")
}

// TestMaxEndpoints: a set over the cap is rejected whole with
// ErrTooManyEndpoints, and the set in force stays.
func TestMaxEndpoints(t *testing.T) {
	d := NewDatastoreWith(Config{MaxEndpoints: 3})
	specs := func(n int) []Spec {
		out := make([]Spec, n)
		for i := range out {
			out[i] = Spec{Name: fmt.Sprintf("e%d", i), Address: fmt.Sprintf("10.0.0.%d:8000", i+1)}
		}
		return out
	}
	if err := d.Replace(specs(3)); err != nil {
		t.Fatal(err)
	}
	if err := d.Replace(specs(4)); !errors.Is(err, ErrTooManyEndpoints) {
		t.Fatalf("4 endpoints over a cap of 3: %v", err)
	}
	if n := len(d.Candidates()); n != 3 {
		t.Fatalf("%d candidates after a refused set", n)
	}
	if err := NewDatastore().Replace(specs(DefaultMaxEndpoints + 1)); !errors.Is(err, ErrTooManyEndpoints) {
		t.Fatalf("default cap: %v", err)
	}
}

// TestAwaitFirstScrape: new endpoints wait for SetHealthy; unchanged ones
// keep their health across a Replace.
func TestAwaitFirstScrape(t *testing.T) {
	d := NewDatastoreWith(Config{AwaitFirstScrape: true})
	if err := d.Replace([]Spec{{Name: "a", Address: "10.0.0.1:8000"}}); err != nil {
		t.Fatal(err)
	}
	if len(d.Candidates()) != 0 {
		t.Fatal("an unscraped endpoint is a candidate")
	}
	d.SetHealthy(d.Get("a"), true)
	if err := d.Replace([]Spec{{Name: "a", Address: "10.0.0.1:8000"}, {Name: "b", Address: "10.0.0.2:8000"}}); err != nil {
		t.Fatal(err)
	}
	if c := d.Candidates(); len(c) != 1 || c[0].Name() != "a" {
		t.Fatalf("candidates %v", c)
	}
}

// account is everything the picker charges to an endpoint.
type account struct {
	load                     Load
	inflight, inflightTokens int64
	protected, sheddable     int64
	decoding, decodingTokens int64
	backlog, backlogPairs    int64
}

func accountOf(e *Endpoint, now time.Time) account {
	a := account{load: e.Load(), inflight: e.InflightRequests(), inflightTokens: e.InflightTokens()}
	a.protected, a.sheddable = e.InflightByClass()
	a.decoding, a.decodingTokens = e.DecodingInflight()
	a.backlog, a.backlogPairs = e.PrefillBacklog(now)
	return a
}

// A rebuilt endpoint at the same address is the same server: it carries
// the load charged to the one it replaced, and the charges made before the
// rebuild change and release it, never leaving it short or negative.
func TestReplaceCarriesLoadToTheSameServer(t *testing.T) {
	now := time.Unix(100, 0)
	tests := []struct {
		name  string
		next  Spec
		carry bool
	}{
		{"labels change", spec("b", "10.0.0.2:8000", RoleLabel, "prefill"), true},
		{"metrics url changes", Spec{Name: "b", Address: "10.0.0.2:8000", MetricsURL: "http://10.0.0.2:9000/metrics"}, true},
		{"renamed at the same address", spec("b2", "10.0.0.2:8000"), true},
		{"same address spelled otherwise", spec("b", "[::ffff:10.0.0.2]:8000", RoleLabel, "prefill"), true},
		{"moved to another address", spec("b", "10.0.0.3:8000"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDatastore()
			if err := d.Replace([]Spec{spec("a", "10.0.0.1:8000"), spec("b", "10.0.0.2:8000", RoleLabel, "decode")}); err != nil {
				t.Fatal(err)
			}
			old := d.Get("b")
			prefill := old.ChargeClass(true, 100, 300, 600, 650)
			decode := old.Charge(0, 50, 100, 120)
			decode.FirstToken()
			computed := old.ChargeComputedBy(false, 0, 200, 200, 210, now.Add(-time.Second))
			old.ObserveStep(now, 0)
			before := accountOf(old, now)

			if err := d.Replace([]Spec{spec("a", "10.0.0.1:8000"), tt.next}); err != nil {
				t.Fatal(err)
			}
			nb := d.Get(tt.next.Name)
			if nb == old {
				t.Fatal("the changed spec kept its endpoint")
			}
			zero := accountOf(NewEndpoint(Spec{}), now)
			wantNew, wantOld := zero, before
			if tt.carry {
				wantNew, wantOld = before, zero
			}
			if got := accountOf(nb, now); got != wantNew {
				t.Errorf("new endpoint after the rebuild: %+v, want %+v", got, wantNew)
			}
			if got := accountOf(old, now); got != wantOld {
				t.Errorf("old endpoint after the rebuild: %+v, want %+v", got, wantOld)
			}
			if got, want := nb.LastStep().Equal(now), tt.carry; got != want {
				t.Errorf("step clock carried = %v, want %v", got, want)
			}
			holder := old
			if tt.carry {
				holder = nb
			}
			if got := prefill.Endpoint(); got != holder {
				t.Errorf("charge's endpoint is %p, want %p", got, holder)
			}

			// The charges made before the rebuild go on where the load is.
			prefill.FirstToken()
			if l := holder.Load(); l.PrefillRequests != 1 || l.DecodeRequests != 2 || l.DecodeTokens != 700 {
				t.Errorf("after a first token: %+v", l)
			}
			prefill.Move(nb) // where it is (or a fallback to the new address)
			decode.Release()
			computed.FirstToken()
			computed.Release()
			prefill.Release()
			for name, e := range map[string]*Endpoint{"new": nb, "old": old} {
				if got := accountOf(e, now); got != zero {
					t.Errorf("%s endpoint after every release: %+v, want nothing", name, got)
				}
			}
		})
	}
}

// Charges that change while their endpoint is rebuilt again and again are
// never lost: whatever interleaving, the member in the end holds exactly
// the charges still open, and nothing once they are released.
func TestReplaceCarriesLoadUnderConcurrentCharges(t *testing.T) {
	d := NewDatastore()
	specAt := func(i int) []Spec { return []Spec{spec("b", "10.0.0.2:8000", "generation", fmt.Sprint(i))} }
	if err := d.Replace(specAt(0)); err != nil {
		t.Fatal(err)
	}
	const workers, rounds = 4, 200
	held := make([]Charge, workers)
	var wg sync.WaitGroup
	for w := range workers {
		held[w] = d.Get("b").ChargeComputedBy(w%2 == 0, 0, 10, 20, 30, time.Unix(1, 0))
		wg.Go(func() {
			for range rounds {
				c := d.ByAddress("10.0.0.2:8000").ChargeClass(w%2 == 1, 0, 5, 10, 15)
				c.FirstToken()
				c.Release()
			}
		})
	}
	for i := 1; i <= rounds; i++ {
		if err := d.Replace(specAt(i)); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	e := d.Get("b")
	if got := e.InflightRequests(); got != workers {
		t.Fatalf("in flight %d after the rebuilds, want the %d charges held", got, workers)
	}
	if l := e.Load(); l.PrefillRequests != workers || l.PrefillTokens != 10*workers || l.DecodeRequests != 0 {
		t.Fatalf("load %+v after the rebuilds", l)
	}
	if tok, _ := e.PrefillBacklog(time.Unix(2, 0)); tok != 0 {
		t.Errorf("backlog %d: the held charges' predicted finishes were not carried", tok)
	}
	for i := range held {
		held[i].Release()
	}
	if got := accountOf(e, time.Unix(0, 0)); got != accountOf(NewEndpoint(Spec{}), time.Unix(0, 0)) {
		t.Errorf("after every release: %+v", got)
	}
}

// ByAddress finds an endpoint by any spelling of its address: those of
// Envoy's served-endpoint metadata ([ip]:port, lower case, compressed),
// of Kubernetes pod IPs and of hand-written endpoints files.
func TestByAddressNormalises(t *testing.T) {
	d := NewDatastore()
	if err := d.Replace([]Spec{
		spec("v6", "[2001:DB8:0:0::1]:8000"),
		spec("v4", "10.0.0.1:8000"),
		{Name: "peer", Address: "gw.peer.example:443", Hostname: true},
	}); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ addr, want string }{
		{"[2001:db8::1]:8000", "v6"},
		{"[2001:DB8::1]:8000", "v6"},
		{"[2001:db8:0:0:0:0:0:1]:8000", "v6"},
		{"[2001:0db8:0000::0001]:8000", "v6"},
		{"[2001:DB8:0:0::1]:8000", "v6"},
		{"10.0.0.1:8000", "v4"},
		{"[::ffff:10.0.0.1]:8000", "v4"},
		{"[::ffff:a00:1]:8000", "v4"},
		{"gw.peer.example:443", "peer"},
		{"GW.Peer.example:443", "peer"},
		{"[2001:db8::1]:8001", ""},      // another port is another server
		{"2001:db8::1:8000", ""},        // no brackets: not ip:port
		{"[2001:db8::1%eth0]:8000", ""}, // zoned: not routable, never a member
		{"[2001:db8::1]", ""},           // no port
		{"10.0.0.1", ""},                // no port
		{"", ""},
	}
	for _, tt := range tests {
		var got string
		if e := d.ByAddress(tt.addr); e != nil {
			got = e.Name()
		}
		if got != tt.want {
			t.Errorf("ByAddress(%q) = %q, want %q", tt.addr, got, tt.want)
		}
	}
	// Two spellings of one address cannot both be members.
	err := d.Replace([]Spec{spec("x", "10.0.0.1:8000"), spec("y", "[::ffff:10.0.0.1]:8000")})
	if !errors.Is(err, ErrDuplicate) {
		t.Errorf("an address and its IPv4-mapped spelling: err = %v, want %v", err, ErrDuplicate)
	}
}

// TestSpecEqual: every field of a spec counts, the rank placement by
// value.
func TestSpecEqual(t *testing.T) {
	base := func() Spec {
		return Spec{Name: "a", Address: "10.0.0.1:8000", Labels: map[string]string{"k": "v"}, NodeAddress: "192.168.0.1",
			DataParallel: &DataParallelRank{Server: "a", Rank: 1}}
	}
	for _, tc := range []struct {
		name   string
		change func(*Spec)
		equal  bool
	}{
		{"the same, another rank pointer", func(s *Spec) { s.DataParallel = &DataParallelRank{Server: "a", Rank: 1} }, true},
		{"node address", func(s *Spec) { s.NodeAddress = "192.168.0.2" }, false},
		{"rank", func(s *Spec) { s.DataParallel.Rank = 2 }, false},
		{"no rank", func(s *Spec) { s.DataParallel = nil }, false},
		{"label", func(s *Spec) { s.Labels = map[string]string{"k": "w"} }, false},
		{"hostname", func(s *Spec) { s.Hostname = true }, false},
	} {
		b := base()
		tc.change(&b)
		if got := SpecEqual(base(), b); got != tc.equal {
			t.Errorf("%s: SpecEqual = %v, want %v", tc.name, got, tc.equal)
		}
	}
}
