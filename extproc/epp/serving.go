package epp

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvgate/kvgate/extproc/endpoints/k8s"
	"github.com/kvgate/kvgate/extproc/epp/leader"
	"github.com/kvgate/kvgate/extproc/epp/metricsauth"
	"github.com/kvgate/kvgate/extproc/epp/tlscert"
	"github.com/kvgate/kvgate/extproc/epp/tracing"
)

// kubernetesMode: the picker discovers its endpoints in the cluster, not
// from --endpoints or the configuration's file-discovery.
func (p *Picker) kubernetesMode() bool {
	return p.opts.kubernetesMode() && (p.built == nil || p.built.Discovery == nil)
}

// serving resolves the serving flags: TLS, leader election, the metrics
// guard and tracing. Like the rest of New it contacts nothing.
func (p *Picker) serving() error {
	o := p.opts
	p.ready = &readiness{leaderElection: o.LeaderElection}
	if o.SecureServing.On(p.kubernetesMode()) {
		to, err := o.tlsOptions()
		if err != nil {
			return err
		}
		if p.tls, err = tlscert.ServerConfig(to); err != nil {
			return fmt.Errorf("--secure-serving: %w", err)
		}
	}
	needKube := o.LeaderElection || o.MetricsAuth.On(p.kubernetesMode())
	if needKube {
		cfg, ns, err := k8s.ClientConfig(o.Kubeconfig, o.PoolNamespace)
		if err != nil {
			return fmt.Errorf("--ha-enable-leader-election / --metrics-endpoint-auth need the Kubernetes API (or set --metrics-endpoint-auth=false): %w", err)
		}
		if o.LeaderElection {
			p.elector, err = leader.New(leader.Config{
				RestConfig: cfg, Namespace: ns, Pool: o.PoolName, Logger: p.log,
				OnChange: p.ready.setLeading,
			})
			if err != nil {
				return err
			}
		}
		if o.MetricsAuth.On(p.kubernetesMode()) {
			if p.guard, err = metricsauth.New(cfg, p.log); err != nil {
				return err
			}
		}
	}
	if o.Tracing {
		t, err := tracing.New(context.Background())
		if err != nil {
			return err
		}
		p.tracer = t
	}
	return nil
}

// extprocOptions are the ext_proc gRPC server's options.
func (p *Picker) extprocOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{grpc.MaxConcurrentStreams(maxConcurrentStreams)}
	if p.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(p.tls)))
	}
	if p.tracer != nil {
		opts = append(opts, grpc.StreamInterceptor(p.tracer.StreamInterceptor()))
	}
	return opts
}

// metricsHandler serves /metrics, behind the token review when on.
func (p *Picker) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	var h http.Handler = promhttp.HandlerFor(p.reg, promhttp.HandlerOpts{Registry: p.reg})
	if p.guard != nil {
		h = p.guard.Wrap(h)
	}
	mux.Handle("/metrics", h)
	return mux
}

// readiness drives the health statuses: ready once discovery has synced
// and, with leader election, only while leading; "liveness" is SERVING
// from the start.
type readiness struct {
	leaderElection bool

	mu      sync.Mutex
	srv     *health.Server
	synced  bool
	leading bool
}

func (r *readiness) attach(srv *health.Server) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.srv = srv
	r.applyLocked()
}

func (r *readiness) setSynced() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.synced = true
	r.applyLocked()
}

func (r *readiness) setLeading(v bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leading = v
	r.applyLocked()
}

// Ready reports whether the readiness probe passes.
func (r *readiness) Ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.readyLocked()
}

func (r *readiness) readyLocked() bool {
	return r.synced && (!r.leaderElection || r.leading)
}

func (r *readiness) applyLocked() {
	if r.srv == nil {
		return
	}
	st := func(ok bool) healthpb.HealthCheckResponse_ServingStatus {
		if ok {
			return healthpb.HealthCheckResponse_SERVING
		}
		return healthpb.HealthCheckResponse_NOT_SERVING
	}
	// Live as soon as it answers: neither a picker waiting for its first
	// endpoint set nor a standby replica may be restarted for it.
	ready := r.readyLocked()
	for _, name := range readinessServices {
		r.srv.SetServingStatus(name, st(ready))
	}
	r.srv.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
}
