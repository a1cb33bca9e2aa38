package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// coalesceWindow is how long discovery waits after the first change of a
// burst before rebuilding, so a rollout that touches many pods at once
// becomes a few applies instead of one per pod. It is the main term of the
// Pod-ready to routable latency and is kept far below a second.
const coalesceWindow = 10 * time.Millisecond

// ErrAlreadyRunning is returned by any Run after the first: a Discovery
// runs once.
var ErrAlreadyRunning = errors.New("kubernetes discovery already ran")

// Discovery is an endpoints.Source backed by Kubernetes, and the priority
// resolver of InferenceObjectives for the same pool.
type Discovery struct {
	log       *slog.Logger
	namespace string
	pool      string // empty in selector mode
	static    target // selector mode only

	cache  cache.Cache
	direct client.Client // uncached, for the start-up checks only

	started atomic.Bool
	// wake has capacity one: informer handlers only raise it, so a burst of
	// events costs nothing and never blocks the informers.
	wake            chan struct{}
	endpointsDirty  atomic.Bool
	objectivesDirty atomic.Bool
	// objectives are the InferenceObjective API versions the cluster
	// serves and the picker may read, most preferred first; set by Run
	// before the informers start and read only by Run's goroutine.
	objectives []schema.GroupVersionKind
	priorities atomic.Pointer[map[string]int]
	// rewrites: the same for InferenceModelRewrites.
	rewriteVersions []schema.GroupVersionKind
	rewritesDirty   atomic.Bool
	rewrites        atomic.Pointer[rewriteTable]
}

// New validates opts and connects the clients; it does not contact the API
// server, so it succeeds before the cluster is reachable.
func New(opts Options) (*Discovery, error) {
	static, err := opts.validate()
	if err != nil {
		return nil, err
	}
	cfg, ns, err := opts.restConfig()
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = "kvgate-epp"
	lg := opts.Logger
	if lg == nil {
		lg = slog.Default()
	}
	lg = lg.With("component", "k8s-discovery", "namespace", ns)
	if opts.PoolName != "" {
		lg = lg.With("pool", opts.PoolName)
	}

	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("registering core types: %w", err)
	}
	if err := inferencev1.Install(scheme); err != nil {
		return nil, fmt.Errorf("registering InferencePool types: %w", err)
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes http client: %w", err)
	}
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("kubernetes rest mapper: %w", err)
	}

	d := &Discovery{
		log:       lg,
		namespace: ns,
		pool:      opts.PoolName,
		static:    static,
		wake:      make(chan struct{}, 1),
	}
	byObject := map[client.Object]cache.ByObject{
		&corev1.Pod{}: {Transform: trimPod},
	}
	if d.pool != "" {
		// Only the one pool is watched, not every pool in the namespace.
		byObject[&inferencev1.InferencePool{}] = cache.ByObject{
			Field: fields.OneTermEqualSelector("metadata.name", d.pool),
		}
		for _, gvk := range append(slices.Clone(objectiveGVKs), rewriteGVKs...) {
			obj := &unstructured.Unstructured{}
			obj.SetGroupVersionKind(gvk)
			byObject[obj] = cache.ByObject{}
		}
	}
	d.cache, err = cache.New(cfg, cache.Options{
		HTTPClient:        httpClient,
		Scheme:            scheme,
		Mapper:            mapper,
		DefaultNamespaces: map[string]cache.Config{ns: {}},
		DefaultTransform:  cache.TransformStripManagedFields(),
		ByObject:          byObject,
		// Reading a kind discovery never registered is a bug here, not a
		// reason to start a new cluster-wide watch on the fly.
		ReaderFailOnMissingInformer: true,
		DefaultWatchErrorHandler: func(_ context.Context, r *toolscache.Reflector, err error) {
			lg.Warn("kubernetes watch failed; retrying", "watch", r.TypeDescription(), "err", err)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("kubernetes cache: %w", err)
	}
	d.direct, err = client.New(cfg, client.Options{HTTPClient: httpClient, Scheme: scheme, Mapper: mapper})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return d, nil
}

// Namespace is the namespace discovery watches.
func (d *Discovery) Namespace() string { return d.namespace }

// Priority resolves an InferenceObjective of this pool to its priority. It
// never blocks; before the objectives are first listed, and in selector
// mode, nothing resolves.
func (d *Discovery) Priority(name string) (int, bool) {
	m := d.priorities.Load()
	if m == nil {
		return 0, false
	}
	p, ok := (*m)[name]
	return p, ok
}

// Run watches the cluster and calls apply with the complete endpoint set
// once the caches are in sync (even when it is empty) and after every change
// to it, until ctx is done; it returns nil then. It returns an error when
// discovery cannot start (the InferencePool API is not installed, or the
// service account may not read pods or the pool) and ErrAlreadyRunning when
// called again.
func (d *Discovery) Run(ctx context.Context, apply func([]endpoints.Spec) error) error {
	// The cache and its informers cannot be restarted, so a Discovery runs
	// once; a new one is cheap.
	if !d.started.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	if err := d.preflight(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // cancelled while starting: not a failure
		}
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := d.register(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	cacheDone := make(chan error, 1)
	go func() { cacheDone <- d.cache.Start(ctx) }()
	cacheRunning := true
	// Wait for the cache goroutine before returning so that no informer
	// outlives Run.
	defer func() {
		cancel()
		if cacheRunning {
			<-cacheDone
		}
	}()

	if !d.cache.WaitForCacheSync(ctx) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("kubernetes cache did not sync")
	}
	d.log.Info("kubernetes discovery started", "objectives", fmt.Sprint(d.objectives), "rewrites", fmt.Sprint(d.rewriteVersions))

	// The handlers have marked everything dirty while the initial lists
	// were replayed; the first sync applies the initial set at once.
	s := syncer{d: d, apply: apply, first: true}
	d.endpointsDirty.Store(true)
	d.objectivesDirty.Store(len(d.objectives) > 0)
	d.rewritesDirty.Store(len(d.rewriteVersions) > 0)
	s.sync(ctx)

	timer := time.NewTimer(coalesceWindow)
	timer.Stop()
	var deadline <-chan time.Time // non-nil while a burst is being coalesced
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-cacheDone:
			cacheRunning = false
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("kubernetes cache stopped: %w", err)
		case <-d.wake:
			if deadline == nil {
				timer.Reset(coalesceWindow)
				deadline = timer.C
			}
		case <-deadline:
			deadline = nil
			s.sync(ctx)
		}
	}
}

// syncer is the state of Run's loop; only that goroutine touches it.
type syncer struct {
	d       *Discovery
	apply   func([]endpoints.Spec) error
	applied []endpoints.Spec
	first   bool
	problem string // last reported reason for an empty set
}

// sync rebuilds whatever the informers marked dirty and applies the
// endpoint set when it changed.
func (s *syncer) sync(ctx context.Context) {
	d := s.d
	if d.objectivesDirty.Swap(false) {
		d.rebuildPriorities(ctx)
	}
	if d.rewritesDirty.Swap(false) {
		d.rebuildRewrites(ctx)
	}
	if !d.endpointsDirty.Swap(false) {
		return
	}
	specs, why := d.desired(ctx)
	if why != s.problem {
		if why != "" {
			d.log.Warn("no endpoints can be discovered", "reason", why)
		} else {
			d.log.Info("endpoint discovery recovered")
		}
		s.problem = why
	}
	if !s.first && sameSpecs(specs, s.applied) {
		return
	}
	s.first = false
	s.applied = specs
	if err := s.apply(specs); err != nil {
		// The same set would be rejected again, so it is not retried; the
		// next change produces a new one.
		d.log.Error("endpoint set rejected", "endpoints", len(specs), "err", err)
		return
	}
	d.log.Info("endpoints updated", "endpoints", len(specs))
}

// signal wakes Run's loop; it never blocks.
func (d *Discovery) signal() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// preflight turns the failures that would otherwise make the informers
// retry forever in silence into errors at start-up. Objectives are
// optional: without their CRD or the right to read them, priorities stay
// unresolved.
func (d *Discovery) preflight(ctx context.Context) error {
	if d.pool != "" {
		var pool inferencev1.InferencePool
		err := d.direct.Get(ctx, types.NamespacedName{Namespace: d.namespace, Name: d.pool}, &pool)
		switch {
		case err == nil:
		case apierrors.IsNotFound(err):
			d.log.Warn("InferencePool not found yet; serving no endpoints until it exists")
		case meta.IsNoMatchError(err):
			return fmt.Errorf("InferencePool API %s is not installed in the cluster: %w", inferencev1.SchemeGroupVersion, err)
		default:
			return fmt.Errorf("reading InferencePool %s/%s: %w", d.namespace, d.pool, err)
		}
	}
	if err := d.direct.List(ctx, &corev1.PodList{}, client.InNamespace(d.namespace), client.Limit(1)); err != nil {
		return fmt.Errorf("listing pods in namespace %s: %w", d.namespace, err)
	}
	if d.pool == "" {
		return nil
	}
	d.objectives = d.readable(ctx, objectiveGVKs)
	if len(d.objectives) == 0 {
		d.log.Info("no InferenceObjective API readable; request priorities default to 0")
	}
	d.rewriteVersions = d.readable(ctx, rewriteGVKs)
	return nil
}

// readable returns those of gvks the cluster serves and the picker may
// list, in order.
func (d *Discovery) readable(ctx context.Context, gvks []schema.GroupVersionKind) []schema.GroupVersionKind {
	var out []schema.GroupVersionKind
	for _, gvk := range gvks {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		err := d.direct.List(ctx, list, client.InNamespace(d.namespace), client.Limit(1))
		switch {
		case err == nil:
			out = append(out, gvk)
		case meta.IsNoMatchError(err):
			d.log.Info("API not installed", "kind", gvk.Kind, "apiVersion", gvk.GroupVersion().String())
		default:
			d.log.Warn("cannot read", "kind", gvk.Kind, "apiVersion", gvk.GroupVersion().String(), "err", err)
		}
	}
	return out
}

// register creates the informers (started later with the cache) and hooks
// the wake-up handlers to them.
func (d *Discovery) register(ctx context.Context) error {
	watch := func(obj client.Object, dirty *atomic.Bool) error {
		inf, err := d.cache.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("watching %T: %w", obj, err)
		}
		mark := func() { dirty.Store(true); d.signal() }
		_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { mark() },
			UpdateFunc: func(any, any) { mark() },
			DeleteFunc: func(any) { mark() },
		})
		if err != nil {
			return fmt.Errorf("watching %T: %w", obj, err)
		}
		return nil
	}
	if err := watch(&corev1.Pod{}, &d.endpointsDirty); err != nil {
		return err
	}
	if d.pool == "" {
		return nil
	}
	if err := watch(&inferencev1.InferencePool{}, &d.endpointsDirty); err != nil {
		return err
	}
	for _, gvk := range d.objectives {
		objective := &unstructured.Unstructured{}
		objective.SetGroupVersionKind(gvk)
		if err := watch(objective, &d.objectivesDirty); err != nil {
			return err
		}
	}
	for _, gvk := range d.rewriteVersions {
		rewrite := &unstructured.Unstructured{}
		rewrite.SetGroupVersionKind(gvk)
		if err := watch(rewrite, &d.rewritesDirty); err != nil {
			return err
		}
	}
	return nil
}

// desired computes the endpoint set from the cache. why explains an empty
// set that is not simply "no ready pods" (missing or invalid pool, cache
// error); it is empty when all is well.
func (d *Discovery) desired(ctx context.Context) (specs []endpoints.Spec, why string) {
	t := d.static
	if d.pool != "" {
		var pool inferencev1.InferencePool
		err := d.cache.Get(ctx, types.NamespacedName{Namespace: d.namespace, Name: d.pool}, &pool)
		if apierrors.IsNotFound(err) {
			return []endpoints.Spec{}, "InferencePool does not exist"
		}
		if err != nil {
			return []endpoints.Spec{}, "reading InferencePool: " + err.Error()
		}
		if t, err = poolTarget(&pool); err != nil {
			return []endpoints.Spec{}, "invalid InferencePool: " + err.Error()
		}
	}
	var pods corev1.PodList
	// The cache's objects are read, never modified, so the deep copy is
	// skipped.
	err := d.cache.List(ctx, &pods, client.InNamespace(d.namespace),
		client.MatchingLabelsSelector{Selector: t.selector}, client.UnsafeDisableDeepCopy)
	if err != nil {
		return []endpoints.Spec{}, "listing pods: " + err.Error()
	}
	specs, skips := specsFor(pods.Items, t.ports)
	for _, s := range skips {
		d.log.Warn("pod not routable", "pod", s.pod, "reason", s.reason)
	}
	return specs, ""
}

// rebuildPriorities publishes a new priority table from the cache: the
// objectives of every served API version, a name of the preferred version
// (llm-d's) shadowing the same name in a later one (GIE's).
func (d *Discovery) rebuildPriorities(ctx context.Context) {
	m := map[string]int{}
	for _, gvk := range d.objectives {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := d.cache.List(ctx, list, client.InNamespace(d.namespace)); err != nil {
			d.log.Warn("listing InferenceObjectives", "apiVersion", gvk.GroupVersion().String(), "err", err)
			return
		}
		items := list.Items
		slices.SortFunc(items, func(a, b unstructured.Unstructured) int { return strings.Compare(a.GetName(), b.GetName()) })
		for i := range items {
			name, prio, ok, err := objectivePriority(items[i].Object, d.pool)
			if err != nil {
				d.log.Warn("ignoring malformed InferenceObjective", "objective", items[i].GetName(), "apiVersion", gvk.GroupVersion().String(), "err", err)
				continue
			}
			if !ok {
				continue
			}
			if _, shadowed := m[name]; shadowed {
				// Names are unique within a version: this one is the
				// preferred version's, which wins.
				continue
			}
			if len(m) == MaxObjectives {
				d.log.Warn("too many InferenceObjectives; the rest resolve to no priority", "max", MaxObjectives)
				break
			}
			m[name] = prio
		}
	}
	d.priorities.Store(&m)
}

// rebuildRewrites publishes a new rewrite table from the cache: the
// rewrites of every served API version, a name of the preferred version
// (llm-d's) shadowing the same name in a later one (GIE's).
func (d *Discovery) rebuildRewrites(ctx context.Context) {
	seen := map[string]bool{}
	var rules []*rewriteRule
	for _, gvk := range d.rewriteVersions {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := d.cache.List(ctx, list, client.InNamespace(d.namespace)); err != nil {
			d.log.Warn("listing InferenceModelRewrites", "apiVersion", gvk.GroupVersion().String(), "err", err)
			return
		}
		for i := range list.Items {
			name := list.Items[i].GetName()
			if seen[name] {
				continue // the preferred version's rewrite of this name wins
			}
			rs, ok, err := rewriteRules(list.Items[i].Object, d.pool)
			if err != nil {
				d.log.Warn("ignoring malformed InferenceModelRewrite", "rewrite", name, "apiVersion", gvk.GroupVersion().String(), "err", err)
				continue
			}
			if !ok {
				continue
			}
			seen[name] = true
			if len(rules)+len(rs) > MaxRewriteRules {
				d.log.Warn("too many InferenceModelRewrite rules; the rest are ignored", "max", MaxRewriteRules)
				break
			}
			rules = append(rules, rs...)
		}
	}
	d.rewrites.Store(newRewriteTable(rules))
}

// RouteLogs sends the logs of the Kubernetes libraries (controller-runtime
// and client-go's klog) to l. Both are process-wide, so a main calls this
// once, before New.
func RouteLogs(l *slog.Logger) {
	ctrllog.SetLogger(logr.FromSlogHandler(l.Handler()))
	klog.SetSlogLogger(l)
}
