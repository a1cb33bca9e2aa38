package leader

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaseName is the Lease the replicas of the picker of pool in namespace
// compete for; llm-d's picker uses the same name, so a kvgate replica and
// an llm-d one never both lead one pool.
func LeaseName(namespace, pool string) string {
	return fmt.Sprintf("epp-%s-%s.llm-d.ai", namespace, pool)
}

// Config is one elector's setting. The durations default to
// controller-runtime's (15 s lease, 10 s renew deadline, 2 s retry), the
// ones llm-d's picker runs with.
type Config struct {
	RestConfig *rest.Config
	Namespace  string
	Pool       string
	// Identity names this replica in the Lease; default $POD_NAME, else
	// the host name, with a random suffix either way.
	Identity      string
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	// OnChange is called with true when this replica starts leading and
	// false when it stops; from the elector's goroutine.
	OnChange func(leading bool)
	Logger   *slog.Logger
}

// Elector competes for the Lease while Run runs.
type Elector struct {
	cfg     Config
	le      *leaderelection.LeaderElector
	leading atomic.Bool
}

// New validates cfg and builds the elector; it does not contact the API
// server.
func New(cfg Config) (*Elector, error) {
	if cfg.Namespace == "" || cfg.Pool == "" {
		return nil, errors.New("leader election needs the pool's namespace and name")
	}
	if cfg.RestConfig == nil {
		return nil, errors.New("leader election needs a Kubernetes client configuration")
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = 15 * time.Second
	}
	if cfg.RenewDeadline == 0 {
		cfg.RenewDeadline = 10 * time.Second
	}
	if cfg.RetryPeriod == 0 {
		cfg.RetryPeriod = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Identity == "" {
		cfg.Identity = os.Getenv("POD_NAME")
		if cfg.Identity == "" {
			cfg.Identity, _ = os.Hostname()
		}
		cfg.Identity += "_" + randSuffix()
	}
	rc := rest.CopyConfig(cfg.RestConfig)
	rc.UserAgent = "kvgate-epp-leader-election"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("leader election client: %w", err)
	}
	e := &Elector{cfg: cfg}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, cfg.Namespace, LeaseName(cfg.Namespace, cfg.Pool),
		cs.CoreV1(), cs.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: cfg.Identity})
	if err != nil {
		return nil, fmt.Errorf("lease lock: %w", err)
	}
	log := cfg.Logger.With("lease", LeaseName(cfg.Namespace, cfg.Pool), "identity", cfg.Identity)
	e.le, err = leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   cfg.LeaseDuration,
		RenewDeadline:   cfg.RenewDeadline,
		RetryPeriod:     cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            LeaseName(cfg.Namespace, cfg.Pool),
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				log.Info("leading: this replica reports ready")
				e.set(true)
			},
			OnStoppedLeading: func() {
				log.Info("no longer leading: this replica reports not ready")
				e.set(false)
			},
			OnNewLeader: func(id string) {
				if id != cfg.Identity {
					log.Info("standing by", "leader", id)
				}
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("leader election: %w", err)
	}
	return e, nil
}

func (e *Elector) set(v bool) {
	if e.leading.Swap(v) != v && e.cfg.OnChange != nil {
		e.cfg.OnChange(v)
	}
}

// Leading reports whether this replica holds the Lease.
func (e *Elector) Leading() bool { return e.leading.Load() }

// Identity is this replica's holder identity in the Lease.
func (e *Elector) Identity() string { return e.cfg.Identity }

// Run competes for the Lease until ctx ends, then releases it if held (a
// stopping leader hands over at once instead of after a lease duration).
// A replica that loses the Lease goes back to competing.
func (e *Elector) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		e.le.Run(ctx) // returns when leadership is lost or ctx ends
		e.set(false)
	}
	return nil
}

// randSuffix tells apart two processes of one pod (a restart) in the
// Lease.
func randSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
