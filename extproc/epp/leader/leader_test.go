package leader

import (
	"context"
	"os"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvgate/kvgate/extproc/endpoints/k8s/k8stest"
	"github.com/kvgate/kvgate/internal/testutil"
)

var suite k8stest.Suite

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }

// fast retries often, so that the standby takes a released Lease within
// a fraction of a second. The lease and renew deadline stay long: with a
// 1.5 s renew deadline a loaded API server could make the leader lose the
// Lease while the test watches, and the test would see a change of leader
// it did not cause (the takeover it checks follows the release, which
// needs no expiry).
func fast(cfg Config) Config {
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 15*time.Second, 10*time.Second, 200*time.Millisecond
	return cfg
}

// Two replicas against the real API server: exactly one leads, the Lease
// carries llm-d's name and the leader's identity, and when the leader
// stops (releasing the Lease) the other takes over.
func TestActivePassive(t *testing.T) {
	env := suite.Env(t)
	base := fast(Config{RestConfig: env.Config, Namespace: "default", Pool: "pool-a"})
	var elect [2]*Elector
	var cancel [2]context.CancelFunc
	var done [2]chan struct{}
	for i := range elect {
		cfg := base
		cfg.Identity = []string{"replica-0", "replica-1"}[i]
		e, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		elect[i] = e
		ctx, c := context.WithCancel(context.Background())
		cancel[i], done[i] = c, make(chan struct{})
		go func() { defer close(done[i]); _ = e.Run(ctx) }()
	}
	defer func() {
		for i := range cancel {
			cancel[i]()
			<-done[i]
		}
	}()
	testutil.WaitFor(t, "a leader", func() bool { return elect[0].Leading() || elect[1].Leading() })
	lead := 0
	if elect[1].Leading() {
		lead = 1
	}
	// Both never lead at once: watch a while.
	for range 10 {
		if elect[0].Leading() && elect[1].Leading() {
			t.Fatal("both replicas lead")
		}
		time.Sleep(100 * time.Millisecond)
	}

	c, err := client.New(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var lease coordinationv1.Lease
	key := types.NamespacedName{Namespace: "default", Name: "epp-default-pool-a.llm-d.ai"}
	if err := c.Get(context.Background(), key, &lease); err != nil {
		t.Fatalf("the Lease llm-d names: %v", err)
	}
	if got := *lease.Spec.HolderIdentity; got != elect[lead].Identity() {
		t.Errorf("Lease holder = %s, want the leader %s", got, elect[lead].Identity())
	}

	cancel[lead]()
	<-done[lead]
	if elect[lead].Leading() {
		t.Error("a stopped replica still reports leading")
	}
	other := 1 - lead
	testutil.WaitFor(t, "the standby to take over", elect[other].Leading)
}

func TestNewErrors(t *testing.T) {
	if _, err := New(Config{Namespace: "ns", Pool: "p"}); err == nil {
		t.Error("no client configuration accepted")
	}
	if got := LeaseName("llm", "qwen"); got != "epp-llm-qwen.llm-d.ai" {
		t.Errorf("LeaseName = %s", got)
	}
}
