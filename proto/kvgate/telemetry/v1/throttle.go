package telemetryv1

// The bits of GPU.throttle_reasons: NVML's clocks event reasons
// (nvmlClocksEventReason*), the contract between the agent, which copies
// NVML's mask, and the picker, which routes on it.
const (
	ThrottleGPUIdle              uint64 = 0x1
	ThrottleApplicationsClocks   uint64 = 0x2
	ThrottleSWPowerCap           uint64 = 0x4
	ThrottleHWSlowdown           uint64 = 0x8
	ThrottleSyncBoost            uint64 = 0x10
	ThrottleSWThermalSlowdown    uint64 = 0x20
	ThrottleHWThermalSlowdown    uint64 = 0x40
	ThrottleHWPowerBrakeSlowdown uint64 = 0x80
	ThrottleDisplayClockSetting  uint64 = 0x100

	// ThrottleThermal and ThrottlePower group the reasons that mean the
	// GPU runs slower than it could for heat or for power.
	ThrottleThermal = ThrottleSWThermalSlowdown | ThrottleHWThermalSlowdown
	ThrottlePower   = ThrottleSWPowerCap | ThrottleHWPowerBrakeSlowdown
)

// ThrottleReasonNames names each bit as metrics label it.
var ThrottleReasonNames = []struct {
	Bit  uint64
	Name string
}{
	{ThrottleGPUIdle, "gpu_idle"},
	{ThrottleApplicationsClocks, "applications_clocks_setting"},
	{ThrottleSWPowerCap, "sw_power_cap"},
	{ThrottleHWSlowdown, "hw_slowdown"},
	{ThrottleSyncBoost, "sync_boost"},
	{ThrottleSWThermalSlowdown, "sw_thermal_slowdown"},
	{ThrottleHWThermalSlowdown, "hw_thermal_slowdown"},
	{ThrottleHWPowerBrakeSlowdown, "hw_power_brake_slowdown"},
	{ThrottleDisplayClockSetting, "display_clock_setting"},
}
