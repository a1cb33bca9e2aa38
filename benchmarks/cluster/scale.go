package cluster

import (
	"fmt"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/saturation"
)

// Scaler resizes the fleet during a run: at every Scaling.Interval the
// simulation hands it the fleet's state and sets the replica count it
// returns, as an HPA sets a Deployment's spec.replicas.
type Scaler interface {
	Scale(FleetState) (int, error)
}

// Scaling configures a resizing fleet.
type Scaling struct {
	Scaler Scaler
	// Interval is the scaler's sync period (the HPA's 15 s by default).
	Interval time.Duration
	// StartupDelay is how long a new replica takes from being created to
	// serving (model load, warm-up); it holds its GPU from the start.
	StartupDelay time.Duration
	// MaxReplicas bounds the fleet (default MaxReplicas).
	MaxReplicas int
}

// Defaults of Scaling.
const (
	DefaultScaleInterval = 15 * time.Second
	DefaultStartupDelay  = 100 * time.Second
)

// FleetState is what a Scaler sees at a sync: the values of the metrics
// the picker, the model servers and kube-state-metrics would export.
type FleetState struct {
	// Now is the time since the start.
	Now time.Duration
	// Replicas are the replicas created and not removed (spec.replicas);
	// Ready those serving.
	Replicas, Ready int
	// Queue is the picker's flow-control queue length.
	Queue int
	// Running is the picker's routed requests whose response has not ended
	// (llm_d_epp_request_running).
	Running int
	// PoolSaturation is the utilization detector's pool value over the
	// serving endpoints.
	PoolSaturation float64
	// InflightTokens is the picker's in-flight token estimate over the
	// serving endpoints (llm_d_epp_inflight_tokens).
	InflightTokens float64
	// KVUsage and GPUUtil are summed over ready replicas: KV-cache use and
	// the share of the last interval each spent running engine steps.
	KVUsage, GPUUtil float64
	// Finished are the requests completed since the last sync; Predicted
	// the picker's latency predictions made since then.
	Finished  []RequestResult
	Predicted []Prediction
}

// Prediction is one latency prediction the picker made when routing.
type Prediction struct{ TTFT, TPOT time.Duration }

// ScalePoint is the fleet's size from At on.
type ScalePoint struct {
	At              time.Duration
	Replicas, Ready int
}

// ScaleEvent is one change of spec.replicas.
type ScaleEvent struct {
	At       time.Duration
	From, To int
}

// ScalingResult is what a resizing run did.
type ScalingResult struct {
	Timeline []ScalePoint
	Events   []ScaleEvent
}

// replica lifecycle in a resizing fleet.
type lifecycle struct {
	created, readyAt time.Time
	ready            bool
	// draining: removed from the pool, finishing its requests.
	draining bool
	// busy is the step time run since the last sync (GPU utilisation).
	busy time.Duration
}

// scaling is the simulation's resizing state.
type scaling struct {
	cfg       Scaling
	next      time.Time
	detector  *saturation.Detector
	finished  []RequestResult
	predicted []Prediction
	nextIdx   int
}

func (c Scaling) withDefaults() (Scaling, error) {
	if c.Interval == 0 {
		c.Interval = DefaultScaleInterval
	}
	if c.StartupDelay == 0 {
		c.StartupDelay = DefaultStartupDelay
	}
	if c.MaxReplicas == 0 {
		c.MaxReplicas = MaxReplicas
	}
	if c.Interval < 0 || c.StartupDelay < 0 || c.MaxReplicas < 1 || c.MaxReplicas > MaxReplicas {
		return c, fmt.Errorf("scaling: interval %v and startup delay %v must not be negative, max replicas 1..%d (got %d)", c.Interval, c.StartupDelay, MaxReplicas, c.MaxReplicas)
	}
	return c, nil
}

// gpuSeconds is the GPU time a replica held from its creation to until.
func (r *replica) gpuSeconds(until time.Time) float64 {
	return until.Sub(r.life.created).Seconds()
}

// resize runs a sync if one is due at now.
func (s *sim) resize(now time.Time) error {
	sc := s.scale
	if sc == nil || now.Before(sc.next) {
		return nil
	}
	for !sc.next.After(now) {
		sc.next = sc.next.Add(sc.cfg.Interval)
	}
	st := s.fleetState(now)
	want, err := sc.cfg.Scaler.Scale(st)
	if err != nil {
		return fmt.Errorf("scaler at %v: %w", st.Now, err)
	}
	want = min(max(want, 0), sc.cfg.MaxReplicas)
	if want != st.Replicas {
		s.res.Scaling.Events = append(s.res.Scaling.Events, ScaleEvent{At: st.Now, From: st.Replicas, To: want})
	}
	for n := st.Replicas; n < want; n++ {
		if err := s.addReplica(now); err != nil {
			return err
		}
	}
	for n := st.Replicas; n > want; n-- {
		s.removeReplica(now)
	}
	if want != st.Replicas {
		if err := s.publish(); err != nil {
			return err
		}
		s.record(now)
	}
	return nil
}

// fleetState gathers the signals and resets the per-interval counters.
func (s *sim) fleetState(now time.Time) FleetState {
	sc := s.scale
	st := FleetState{Now: now.Sub(s.start), Running: len(s.live), Finished: sc.finished, Predicted: sc.predicted}
	sc.finished, sc.predicted = nil, nil
	if s.flow != nil {
		st.Queue = s.flow.c.Len()
	}
	var serving []*endpoints.Endpoint
	for _, r := range s.reps {
		if r.life.draining {
			continue
		}
		st.Replicas++
		if !r.life.ready {
			continue
		}
		st.Ready++
		serving = append(serving, r.ep)
		st.KVUsage += r.eng.Metrics().KVUsage
		st.GPUUtil += min(1, r.life.busy.Seconds()/sc.cfg.Interval.Seconds())
		st.InflightTokens += float64(r.ep.InflightTokens())
	}
	for _, r := range s.reps {
		r.life.busy = 0
	}
	st.PoolSaturation = sc.detector.Pool(serving)
	return st
}

// addReplica creates a replica that serves after the startup delay.
func (s *sim) addReplica(now time.Time) error {
	r, err := s.newReplica(s.scale.nextIdx, s.opts.Presets[0])
	if err != nil {
		return err
	}
	s.scale.nextIdx++
	r.life = lifecycle{created: now, readyAt: now.Add(s.scale.cfg.StartupDelay)}
	s.reps = append(s.reps, r)
	s.byAddr[r.addr] = r
	return nil
}

// removeReplica removes one replica as a ReplicaSet scales down: one not
// yet ready first (the newest), else the newest ready one, which leaves the
// pool at once and finishes the requests it holds.
func (s *sim) removeReplica(now time.Time) {
	victim := -1
	for i := len(s.reps) - 1; i >= 0; i-- {
		r := s.reps[i]
		if r.life.draining {
			continue
		}
		if !r.life.ready {
			victim = i
			break
		}
		if victim < 0 {
			victim = i
		}
	}
	if victim < 0 {
		return
	}
	r := s.reps[victim]
	if !r.life.ready {
		s.retire(victim, now)
		return
	}
	r.life.draining = true
	s.index.ClearEndpoint(r.addr)
}

// retire drops replica i from the fleet and books its GPU time.
func (s *sim) retire(i int, now time.Time) {
	s.res.GPUSeconds += s.reps[i].gpuSeconds(now)
	s.reps = append(s.reps[:i], s.reps[i+1:]...)
}

// settle makes due replicas ready and retires drained ones; it reports
// whether the pool's membership changed.
func (s *sim) settle(now time.Time) error {
	if s.scale == nil {
		return nil
	}
	changed := false
	for i := 0; i < len(s.reps); i++ {
		r := s.reps[i]
		switch {
		case !r.life.ready && !r.readyAt().After(now):
			r.life.ready = true
			changed = true
		case r.life.draining && !r.busy && r.eng.Metrics().Running+r.eng.Metrics().Waiting == 0:
			s.retire(i, now)
			i--
		}
	}
	if !changed {
		return nil
	}
	if err := s.publish(); err != nil {
		return err
	}
	s.record(now)
	return nil
}

func (r *replica) readyAt() time.Time { return r.life.readyAt }

// publish makes the serving replicas the pool's membership.
func (s *sim) publish() error {
	var specs []endpoints.Spec
	for _, r := range s.reps {
		if r.life.ready && !r.life.draining {
			specs = append(specs, r.spec)
		}
	}
	if err := s.ds.Replace(specs); err != nil {
		return err
	}
	for _, r := range s.reps {
		if r.life.ready && !r.life.draining && r.ep == nil {
			r.ep = s.ds.ByAddress(r.addr)
			s.scrape(r)
		}
	}
	return nil
}

// record appends the fleet's size at now to the timeline.
func (s *sim) record(now time.Time) {
	p := ScalePoint{At: now.Sub(s.start)}
	for _, r := range s.reps {
		if r.life.draining {
			continue
		}
		p.Replicas++
		if r.life.ready {
			p.Ready++
		}
	}
	tl := &s.res.Scaling.Timeline
	if n := len(*tl); n > 0 && (*tl)[n-1].At == p.At {
		(*tl)[n-1] = p
		return
	}
	*tl = append(*tl, p)
}

// nextScaleEvent is the next sync or readiness, neither of which is
// progress on its own.
func (s *sim) nextScaleEvent(take func(time.Time)) {
	if s.scale == nil {
		return
	}
	take(s.scale.next)
	for _, r := range s.reps {
		if !r.life.ready {
			take(r.life.readyAt)
		}
	}
}
