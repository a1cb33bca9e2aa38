package gpu

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kvgate/kvgate/agent/telemetry"
)

// Config configures a Collector.
type Config struct {
	// Lib is the NVML library (nil: the system's, loaded by dlopen).
	Lib nvml.Interface
	// Endpoints maps a GPU index to the model servers on it ("host:port"),
	// added to what the pod mapping finds.
	Endpoints map[int][]string
	// ProcRoot is where host processes are read for the pod mapping
	// ("/proc"; "" turns the mapping off).
	ProcRoot string
	// MinSamplePeriod is how long a sample is reused, which bounds the
	// NVML calls many watchers and scrapes cause (default 250 ms).
	MinSamplePeriod time.Duration
	Now             func() time.Time
	Log             *slog.Logger
}

// Collector samples the node's GPUs. It implements telemetry.GPUSource and
// prometheus.Collector.
type Collector struct {
	cfg     Config
	lib     nvml.Interface
	reason  string // why NVML is unavailable; "" when it is
	devices []device
	events  nvml.EventSet

	// sampling serializes reads of the GPUs (device.unsupported).
	sampling sync.Mutex
	mu       sync.Mutex
	xid      []xidState
	sampled  time.Time
	sample   []telemetry.GPU
}

type device struct {
	h     nvml.Device
	index int
	uuid  string
	name  string
	// unsupported remembers the queries this GPU answered NOT_SUPPORTED, so
	// that they are neither retried nor reported as zero.
	unsupported map[string]bool
}

type xidState struct {
	count uint64
	last  uint64
	at    time.Time
}

// ErrUnavailable is wrapped by New's error when NVML cannot be used.
var ErrUnavailable = errors.New("NVML unavailable")

// New opens NVML and enumerates the GPUs. Without NVML it logs once why,
// and returns a Collector that reports no GPUs, and the error (wrapping
// ErrUnavailable), so that the agent runs on without it.
func New(cfg Config) (*Collector, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.MinSamplePeriod <= 0 {
		cfg.MinSamplePeriod = 250 * time.Millisecond
	}
	c := &Collector{cfg: cfg, lib: cfg.Lib}
	if c.lib == nil {
		c.lib = nvml.New()
	}
	if err := c.open(); err != nil {
		c.reason = err.Error()
		c.devices = nil
		cfg.Log.Warn("GPU telemetry off: running without NVML", "reason", c.reason)
		return c, fmt.Errorf("%w: %s", ErrUnavailable, c.reason)
	}
	c.xid = make([]xidState, len(c.devices))
	names := make([]string, len(c.devices))
	for i, d := range c.devices {
		names[i] = d.name
	}
	cfg.Log.Info("GPU telemetry over NVML", "gpus", len(c.devices), "models", slices.Compact(names), "xid_events", c.events != nil)
	return c, nil
}

func (c *Collector) open() (err error) {
	defer func() {
		// go-nvml panics when libnvidia-ml lacks a symbol it expects (an
		// old driver); that is "unavailable", not a crash of the agent.
		if r := recover(); r != nil {
			err = fmt.Errorf("NVML: %v", r)
		}
	}()
	if ret := c.lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvmlInit: %s", nvml.ErrorString(ret))
	}
	n, ret := c.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		c.lib.Shutdown()
		return fmt.Errorf("nvmlDeviceGetCount: %s", nvml.ErrorString(ret))
	}
	for i := range n {
		h, ret := c.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			c.lib.Shutdown()
			return fmt.Errorf("nvmlDeviceGetHandleByIndex(%d): %s", i, nvml.ErrorString(ret))
		}
		d := device{h: h, index: i, unsupported: map[string]bool{}}
		d.uuid, _ = h.GetUUID()
		d.name, _ = h.GetName()
		c.devices = append(c.devices, d)
	}
	if n == 0 {
		c.lib.Shutdown()
		return errors.New("NVML sees no GPU")
	}
	c.registerXID()
	return nil
}

// registerXID asks for XID critical-error events on every GPU that
// supports them; without an event set the XID counts stay zero.
func (c *Collector) registerXID() {
	set, ret := c.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		c.cfg.Log.Warn("NVML event set: XID errors not tracked", "err", nvml.ErrorString(ret))
		return
	}
	registered := 0
	for _, d := range c.devices {
		types, ret := d.h.GetSupportedEventTypes()
		if ret != nvml.SUCCESS || types&nvml.EventTypeXidCriticalError == 0 {
			continue
		}
		if ret := d.h.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
			c.cfg.Log.Warn("NVML XID events", "gpu", d.index, "err", nvml.ErrorString(ret))
			continue
		}
		registered++
	}
	if registered == 0 {
		set.Free()
		return
	}
	c.events = set
}

// Available implements telemetry.GPUSource.
func (c *Collector) Available() (bool, string) { return c.reason == "", c.reason }

// Run waits for XID events until ctx ends; without NVML or events it
// returns at once.
func (c *Collector) Run(ctx context.Context) {
	if c.events == nil {
		return
	}
	failures := 0
	for ctx.Err() == nil {
		data, ret := c.events.Wait(500)
		switch ret {
		case nvml.SUCCESS:
			failures = 0
			if data.EventType&nvml.EventTypeXidCriticalError != 0 {
				c.recordXID(data)
			}
		case nvml.ERROR_TIMEOUT:
		default:
			// A driver in trouble can fail every wait at once: back off
			// so the loop does not spin, and say so once.
			if failures == 0 {
				c.cfg.Log.Warn("NVML event wait", "err", nvml.ErrorString(ret))
			}
			failures++
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func (c *Collector) recordXID(data nvml.EventData) {
	i := c.indexOf(data.Device)
	if i < 0 {
		return
	}
	now := c.cfg.Now()
	c.mu.Lock()
	x := &c.xid[i]
	x.count++
	x.last, x.at = data.EventData, now
	c.sampled = time.Time{} // the next read shows it
	c.mu.Unlock()
	c.cfg.Log.Warn("GPU XID error", "gpu", c.devices[i].index, "uuid", c.devices[i].uuid, "xid", data.EventData)
}

func (c *Collector) indexOf(h nvml.Device) int {
	if h == nil {
		return -1
	}
	for i, d := range c.devices {
		if d.h == h {
			return i
		}
	}
	uuid, ret := h.GetUUID()
	if ret != nvml.SUCCESS {
		return -1
	}
	for i, d := range c.devices {
		if d.uuid == uuid {
			return i
		}
	}
	return -1
}

// Close releases NVML.
func (c *Collector) Close() {
	if c.reason != "" {
		return
	}
	if c.events != nil {
		c.events.Free()
	}
	c.lib.Shutdown()
}

// GPUs implements telemetry.GPUSource: a sample at most MinSamplePeriod
// old. Callers must not modify it.
func (c *Collector) GPUs() []telemetry.GPU {
	if c.reason != "" {
		return nil
	}
	now := c.cfg.Now()
	c.sampling.Lock()
	defer c.sampling.Unlock()
	c.mu.Lock()
	if !c.sampled.IsZero() && now.Sub(c.sampled) < c.cfg.MinSamplePeriod {
		s := c.sample
		c.mu.Unlock()
		return s
	}
	c.mu.Unlock()
	out := make([]telemetry.GPU, len(c.devices))
	for i := range c.devices {
		out[i] = c.read(&c.devices[i])
	}
	c.mu.Lock()
	for i := range out {
		x := c.xid[i]
		out[i].XIDErrors, out[i].LastXID, out[i].LastXIDTime = x.count, x.last, x.at
	}
	c.sample, c.sampled = out, now
	c.mu.Unlock()
	return out
}

// query runs one NVML call unless the GPU said it does not support it.
func query[T any](d *device, what string, f func() (T, nvml.Return)) (T, bool) {
	var zero T
	if d.unsupported[what] {
		return zero, false
	}
	v, ret := f()
	switch ret {
	case nvml.SUCCESS:
		return v, true
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		d.unsupported[what] = true
	}
	return zero, false
}

func (c *Collector) read(d *device) telemetry.GPU {
	g := telemetry.GPU{Index: d.index, UUID: d.uuid, Name: d.name}
	if u, ok := query(d, "utilization", d.h.GetUtilizationRates); ok {
		g.UtilizationPercent, g.MemoryUtilizationPercent = u.Gpu, u.Memory
	}
	if m, ok := query(d, "memory", d.h.GetMemoryInfo); ok {
		g.MemoryUsedBytes, g.MemoryTotalBytes = m.Used, m.Total
	}
	g.PowerMilliwatts, _ = query(d, "power", d.h.GetPowerUsage)
	g.PowerLimitMilliwatts, _ = query(d, "power_limit", d.h.GetEnforcedPowerLimit)
	g.TemperatureCelsius, _ = query(d, "temperature", func() (uint32, nvml.Return) { return d.h.GetTemperature(nvml.TEMPERATURE_GPU) })
	g.SMClockMHz, _ = query(d, "sm_clock", func() (uint32, nvml.Return) { return d.h.GetClockInfo(nvml.CLOCK_SM) })
	g.MemClockMHz, _ = query(d, "mem_clock", func() (uint32, nvml.Return) { return d.h.GetClockInfo(nvml.CLOCK_MEM) })
	g.ThrottleReasons, _ = query(d, "throttle", d.h.GetCurrentClocksEventReasons)
	g.ECCCorrected, _ = query(d, "ecc_corrected", func() (uint64, nvml.Return) {
		return d.h.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC)
	})
	g.ECCUncorrected, _ = query(d, "ecc_uncorrected", func() (uint64, nvml.Return) {
		return d.h.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	})
	if v, ok := query(d, "nvlink", func() ([2]uint64, nvml.Return) { return nvlinkBytes(d.h) }); ok {
		g.NVLinkTxBytes, g.NVLinkRxBytes = v[0], v[1]
	}
	g.Endpoints = slices.Clone(c.cfg.Endpoints[d.index])
	if c.cfg.ProcRoot != "" {
		if procs, ok := query(d, "processes", d.h.GetComputeRunningProcesses); ok {
			for _, p := range procs {
				pod := podOf(c.cfg.ProcRoot, p.Pid)
				if pod.uid != "" && !slices.Contains(g.PodUIDs, pod.uid) {
					g.PodUIDs = append(g.PodUIDs, pod.uid)
				}
				for _, ip := range pod.ips {
					if !slices.Contains(g.Endpoints, ip) {
						g.Endpoints = append(g.Endpoints, ip)
					}
				}
			}
		}
	}
	return g
}

// nvlinkBytes reads the NVLink data counters summed over all links (scope
// UINT_MAX), converted from KiB.
func nvlinkBytes(h nvml.Device) ([2]uint64, nvml.Return) {
	fv := []nvml.FieldValue{
		{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ScopeId: math.MaxUint32},
		{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ScopeId: math.MaxUint32},
	}
	if ret := h.GetFieldValues(fv); ret != nvml.SUCCESS {
		return [2]uint64{}, ret
	}
	var out [2]uint64
	for i, f := range fv {
		if nvml.Return(f.NvmlReturn) != nvml.SUCCESS {
			return out, nvml.Return(f.NvmlReturn)
		}
		out[i] = fieldUint(f) * 1024
	}
	return out, nvml.SUCCESS
}

// fieldUint decodes a field value's union by its type.
func fieldUint(f nvml.FieldValue) uint64 {
	switch f.ValueType {
	case 1, 5: // unsigned int, signed int
		return uint64(binary.LittleEndian.Uint32(f.Value[:4]))
	case 6: // unsigned short
		return uint64(binary.LittleEndian.Uint16(f.Value[:2]))
	case 0: // double
		return uint64(math.Float64frombits(binary.LittleEndian.Uint64(f.Value[:])))
	}
	return binary.LittleEndian.Uint64(f.Value[:])
}
