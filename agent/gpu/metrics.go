package gpu

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	telemetryv1 "github.com/kvgate/kvgate/proto/kvgate/telemetry/v1"
)

// The agent's GPU metrics. Every series carries gpu (NVML index), uuid and
// model; the label sets are bounded by the node's GPUs, the clocks, the
// throttle reasons NVML defines, and the pods on each GPU.
var (
	labels         = []string{"gpu", "uuid", "model"}
	descAvailable  = prometheus.NewDesc("kvgate_gpu_nvml_available", "1 when the agent reads its GPUs through NVML, 0 when it runs without.", nil, nil)
	descUtil       = prometheus.NewDesc("kvgate_gpu_utilization_percent", "Percent of the last sample period a kernel ran on the GPU.", labels, nil)
	descMemUtil    = prometheus.NewDesc("kvgate_gpu_memory_utilization_percent", "Percent of the last sample period device memory was read or written.", labels, nil)
	descMemUsed    = prometheus.NewDesc("kvgate_gpu_memory_used_bytes", "Device memory in use.", labels, nil)
	descMemTotal   = prometheus.NewDesc("kvgate_gpu_memory_total_bytes", "Device memory installed.", labels, nil)
	descPower      = prometheus.NewDesc("kvgate_gpu_power_watts", "Power draw.", labels, nil)
	descPowerLimit = prometheus.NewDesc("kvgate_gpu_power_limit_watts", "Enforced power limit.", labels, nil)
	descTemp       = prometheus.NewDesc("kvgate_gpu_temperature_celsius", "GPU core temperature.", labels, nil)
	descClock      = prometheus.NewDesc("kvgate_gpu_clock_mhz", "Current clock by domain (sm, memory).", append(labels, "clock"), nil)
	descThrottle   = prometheus.NewDesc("kvgate_gpu_throttle_reason", "1 while NVML reports the clocks event (throttle) reason.", append(labels, "reason"), nil)
	descXID        = prometheus.NewDesc("kvgate_gpu_xid_errors_total", "XID critical errors since the agent started.", labels, nil)
	descLastXID    = prometheus.NewDesc("kvgate_gpu_last_xid", "Code of the last XID critical error (0: none).", labels, nil)
	descECC        = prometheus.NewDesc("kvgate_gpu_ecc_errors_total", "Volatile ECC errors by type (corrected, uncorrected).", append(labels, "type"), nil)
	descNVLink     = prometheus.NewDesc("kvgate_gpu_nvlink_bytes_total", "NVLink data bytes by direction (tx, rx), all links.", append(labels, "direction"), nil)
	descPod        = prometheus.NewDesc("kvgate_gpu_pod_info", "A pod with processes on the GPU (1).", append(labels, "pod_uid"), nil)
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descAvailable, descUtil, descMemUtil, descMemUsed, descMemTotal, descPower,
		descPowerLimit, descTemp, descClock, descThrottle, descXID, descLastXID, descECC, descNVLink, descPod} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A value the GPU does not
// support is left out rather than reported as zero.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	avail := 0.0
	if c.reason == "" {
		avail = 1
	}
	ch <- prometheus.MustNewConstMetric(descAvailable, prometheus.GaugeValue, avail)
	gs := c.GPUs()
	for i, g := range gs {
		d := &c.devices[i]
		l := []string{strconv.Itoa(g.Index), g.UUID, g.Name}
		gauge := func(desc *prometheus.Desc, what string, v float64, extra ...string) {
			if !d.unsupported[what] {
				ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, append(l, extra...)...)
			}
		}
		counter := func(desc *prometheus.Desc, what string, v float64, extra ...string) {
			if !d.unsupported[what] {
				ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, v, append(l, extra...)...)
			}
		}
		c.sampling.Lock() // d.unsupported
		gauge(descUtil, "utilization", float64(g.UtilizationPercent))
		gauge(descMemUtil, "utilization", float64(g.MemoryUtilizationPercent))
		gauge(descMemUsed, "memory", float64(g.MemoryUsedBytes))
		gauge(descMemTotal, "memory", float64(g.MemoryTotalBytes))
		gauge(descPower, "power", float64(g.PowerMilliwatts)/1000)
		gauge(descPowerLimit, "power_limit", float64(g.PowerLimitMilliwatts)/1000)
		gauge(descTemp, "temperature", float64(g.TemperatureCelsius))
		gauge(descClock, "sm_clock", float64(g.SMClockMHz), "sm")
		gauge(descClock, "mem_clock", float64(g.MemClockMHz), "memory")
		for _, r := range telemetryv1.ThrottleReasonNames {
			v := 0.0
			if g.ThrottleReasons&r.Bit != 0 {
				v = 1
			}
			gauge(descThrottle, "throttle", v, r.Name)
		}
		counter(descXID, "", float64(g.XIDErrors))
		gauge(descLastXID, "", float64(g.LastXID))
		counter(descECC, "ecc_corrected", float64(g.ECCCorrected), "corrected")
		counter(descECC, "ecc_uncorrected", float64(g.ECCUncorrected), "uncorrected")
		counter(descNVLink, "nvlink", float64(g.NVLinkTxBytes), "tx")
		counter(descNVLink, "nvlink", float64(g.NVLinkRxBytes), "rx")
		c.sampling.Unlock()
		for _, uid := range g.PodUIDs {
			ch <- prometheus.MustNewConstMetric(descPod, prometheus.GaugeValue, 1, append(l, uid)...)
		}
	}
}
