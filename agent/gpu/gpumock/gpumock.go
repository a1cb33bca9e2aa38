// Package gpumock builds go-nvml's mock DGX servers (pkg/nvml/mock/dgx*)
// with the telemetry calls agent/gpu makes filled in from state a test
// controls: utilisation, power, temperature, clocks, throttle reasons,
// ECC counts, NVLink counters, running processes, and XID critical-error
// events delivered through an NVML event set. go-nvml's servers answer
// identity and MIG calls only; every other call would panic.
//
// The mocks record every call they get (go-nvml's generated mocks keep a
// call log), so a Server is for tests, not for long-running processes.
package gpumock

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Models are the DGX systems go-nvml mocks, by the names New takes.
var Models = map[string]func() *server.Server{
	"dgxa100": dgxa100.New,
	"dgxh100": dgxh100.New,
	"dgxh200": dgxh200.New,
	"dgxb200": dgxb200.New,
}

// State is one mock GPU's telemetry.
type State struct {
	UtilizationPercent, MemoryUtilizationPercent uint32
	MemoryUsedBytes                              uint64
	PowerMilliwatts, PowerLimitMilliwatts        uint32
	TemperatureCelsius                           uint32
	SMClockMHz, MemClockMHz                      uint32
	ThrottleReasons                              uint64
	ECCCorrected, ECCUncorrected                 uint64
	// NVLinkKiBPerSec grows the NVLink TX and RX counters with time.
	NVLinkKiBPerSec uint64
	PIDs            []uint32
}

// Server is a mock DGX system.
type Server struct {
	*server.Server
	events chan nvml.EventData

	mu    sync.Mutex
	state []State
	start time.Time
}

// New returns the mock of model (a key of Models), its GPUs idle at
// plausible values: 30 °C, 10% busy, 100 W of a 700 W limit.
func New(model string) (*Server, error) {
	f, ok := Models[model]
	if !ok {
		return nil, fmt.Errorf("gpumock: unknown model %q (known: dgxa100, dgxh100, dgxh200, dgxb200)", model)
	}
	s := &Server{Server: f(), events: make(chan nvml.EventData, 64), start: time.Now()}
	s.state = make([]State, len(s.Devices))
	for i := range s.state {
		s.state[i] = State{UtilizationPercent: 10, MemoryUtilizationPercent: 5, MemoryUsedBytes: 1 << 30,
			PowerMilliwatts: 100_000, PowerLimitMilliwatts: 700_000, TemperatureCelsius: 30,
			SMClockMHz: 1980, MemClockMHz: 2619, NVLinkKiBPerSec: 1 << 20}
	}
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: s.wait,
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	for i, d := range s.Devices {
		s.fill(i, d.(*server.Device))
	}
	return s, nil
}

// Set replaces GPU i's state.
func (s *Server) Set(i int, st State) {
	s.mu.Lock()
	s.state[i] = st
	s.mu.Unlock()
}

// Update changes GPU i's state in place.
func (s *Server) Update(i int, f func(*State)) {
	s.mu.Lock()
	f(&s.state[i])
	s.mu.Unlock()
}

// InjectXID delivers an XID critical-error event for GPU i, as the driver
// does when it logs "NVRM: Xid".
func (s *Server) InjectXID(i int, xid uint64) {
	s.events <- nvml.EventData{Device: s.Devices[i], EventType: nvml.EventTypeXidCriticalError, EventData: xid}
}

func (s *Server) wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer t.Stop()
	select {
	case e := <-s.events:
		return e, nvml.SUCCESS
	case <-t.C:
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}

func (s *Server) get(i int) State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state[i]
}

func (s *Server) fill(i int, d *server.Device) {
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		st := s.get(i)
		return nvml.Utilization{Gpu: st.UtilizationPercent, Memory: st.MemoryUtilizationPercent}, nvml.SUCCESS
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		st := s.get(i)
		total := d.MemoryInfo.Total
		used := min(st.MemoryUsedBytes, total)
		return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
	}
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return s.get(i).PowerMilliwatts, nvml.SUCCESS }
	d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return s.get(i).PowerLimitMilliwatts, nvml.SUCCESS }
	d.GetTemperatureFunc = func(sensor nvml.TemperatureSensors) (uint32, nvml.Return) {
		if sensor != nvml.TEMPERATURE_GPU {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		return s.get(i).TemperatureCelsius, nvml.SUCCESS
	}
	d.GetClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
		st := s.get(i)
		switch c {
		case nvml.CLOCK_SM, nvml.CLOCK_GRAPHICS:
			return st.SMClockMHz, nvml.SUCCESS
		case nvml.CLOCK_MEM:
			return st.MemClockMHz, nvml.SUCCESS
		}
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return s.get(i).ThrottleReasons, nvml.SUCCESS }
	d.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, _ nvml.EccCounterType) (uint64, nvml.Return) {
		st := s.get(i)
		if t == nvml.MEMORY_ERROR_TYPE_CORRECTED {
			return st.ECCCorrected, nvml.SUCCESS
		}
		return st.ECCUncorrected, nvml.SUCCESS
	}
	d.GetFieldValuesFunc = func(fv []nvml.FieldValue) nvml.Return {
		st := s.get(i)
		kib := uint64(time.Since(s.start).Seconds() * float64(st.NVLinkKiBPerSec))
		for j := range fv {
			switch fv[j].FieldId {
			case nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
				if fv[j].ScopeId != math.MaxUint32 {
					fv[j].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
					continue
				}
				fv[j].ValueType = 3 // unsigned long long
				putUint64(fv[j].Value[:], kib)
				fv[j].NvmlReturn = uint32(nvml.SUCCESS)
			default:
				fv[j].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			}
		}
		return nvml.SUCCESS
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		st := s.get(i)
		out := make([]nvml.ProcessInfo, len(st.PIDs))
		for j, pid := range st.PIDs {
			out[j] = nvml.ProcessInfo{Pid: pid, UsedGpuMemory: st.MemoryUsedBytes}
		}
		return out, nvml.SUCCESS
	}
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypeXidCriticalError, nvml.SUCCESS }
	d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
}

func putUint64(b []byte, v uint64) {
	for k := range 8 {
		b[k] = byte(v >> (8 * k))
	}
}
