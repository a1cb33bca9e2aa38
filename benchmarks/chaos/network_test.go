package chaos

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil/delaylink"
)

// lossyNetwork runs a second, small fleet with its simulators on the far
// side of a slow, lossy link (delaylink: the picker and the gateway in one
// network namespace, the simulators in another; every packet towards the
// simulators waits delay, and every dropEvery-th data segment is lost, so
// TCP retransmits). The picker's scrapes and the gateway's upstream
// traffic cross it; the simulators' KV events come back undelayed. It
// holds when every request succeeds, both endpoints stay routable the whole
// time and KV events arrive: a slow network must not read as dead servers.
// A scrape that loses a segment waits out TCP's retransmission timeout
// (at least 200 ms) and may miss its own 250 ms timeout; one such failure
// must not drop the endpoint, and the count is reported.
func lossyNetwork(t *testing.T, bin, wasm, tok string, delay time.Duration, dropEvery int) result {
	l := delaylink.New(t, delaylink.Options{Delay: delay, DropEvery: dropEvery})
	at := placement{simNS: l.B, simHost: l.AddrB.String(), frontNS: l.A, frontHost: l.AddrA.String(),
		dial: func(_ context.Context, _, addr string) (net.Conn, error) { return l.Dial(l.A, addr) }}
	f := startFleetAt(t, bin, wasm, tok, 2, at)
	// Scrapes failed while the simulators started; only later ones count.
	scrapeErrors0 := f.metric("kvgate_endpoint_scrape_errors_total")
	minReady := make(chan float64, 1)
	stop := make(chan struct{})
	go func() {
		least := f.metric("llm_d_epp_ready_endpoints")
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				minReady <- least
				return
			case <-tick.C:
				least = min(least, f.metric("llm_d_epp_ready_endpoints"))
			}
		}
	}()
	start := time.Now()
	codes := map[int]int{}
	for i := range 40 {
		// Several KV blocks each, so that the servers publish events.
		prompt := fmt.Sprintf("request %d over the lossy link: %s", i, strings.Repeat("tokens that fill whole cache blocks ", 20))
		codes[f.complete(context.Background(), prompt)]++
	}
	took := time.Since(start)
	close(stop)
	ready := <-minReady
	scrapeErrors := f.metric("kvgate_endpoint_scrape_errors_total") - scrapeErrors0
	events := f.metric("kvgate_kvevents_events_total")
	return result{fmt.Sprintf("simulators behind a link with +%v and 1 in %d data segments lost", delay, dropEvery),
		codes[200] == 40 && ready == 2 && events > 0,
		fmt.Sprintf("40 requests in %v: %v; fewest ready endpoints %.0f of 2, failed scrapes %.0f, KV events received %.0f; the link forwarded %d packets and dropped %d",
			took.Round(time.Millisecond), codes, ready, scrapeErrors, events, l.Forwarded(), l.Dropped())}
}
