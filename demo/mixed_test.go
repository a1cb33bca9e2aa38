package demo

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/demo/report"
)

// --engine-priority adds its fleet last, with the engine and picker flags,
// and the verdict compares its online TTFT with the fleet without flow
// control.
func TestMixedEnginePriorityScenario(t *testing.T) {
	if got := DefaultMixedOptions().scenarios(); !slices.Equal(got, mixedScenarios) {
		t.Fatalf("default scenarios %v", got)
	}
	m := DefaultMixedOptions()
	m.EnginePriority = true
	sc := m.scenarios()
	if len(sc) != len(mixedScenarios)+1 || sc[len(sc)-1] != enginePriorityScenario || len(mixedScenarios) != 3 {
		t.Fatalf("scenarios %v", sc)
	}
	for _, policy := range []string{PolicyPrecise, PolicyLoad} {
		c := StackConfig{Policy: policy}
		enginePriorityArgs(&c)
		if !slices.Contains(c.SimArgs, "--scheduling-policy=priority") || !slices.Contains(c.EPPArgs, "--engine-priority") ||
			slices.Contains(c.GatewayArgs, "--request-body-mode=full-duplex-streamed") == readsBody(policy) {
			t.Errorf("%s: sim %v epp %v gateway %v", policy, c.SimArgs, c.EPPArgs, c.GatewayArgs)
		}
	}
	sum := func(scenario, class string, p50, p90 float64) classOutcome {
		return classOutcome{Scenario: scenario, Class: class, Summary: report.Summary{Requests: 10, TTFTP50: p50, TTFTP90: p90}}
	}
	outcomes := []classOutcome{
		sum("online-only", objectiveOnline, 0.1, 1),
		sum("mixed-flow-control", objectiveOnline, 0.1, 1.1), sum("mixed-flow-control", objectiveBatch, 1, 2),
		sum("mixed-no-flow-control", objectiveOnline, 0.2, 4), sum("mixed-no-flow-control", objectiveBatch, 1, 2),
		sum("mixed-engine-priority", objectiveOnline, 0.2, 2), sum("mixed-engine-priority", objectiveBatch, 1, 2),
	}
	lines := mixedVerdict(sc, outcomes)
	if len(lines) != 4 || !strings.Contains(lines[2], "mixed-engine-priority: online p90 TTFT 2000 ms = 2.00×") ||
		!strings.Contains(lines[3], "online p90 TTFT 0.50×, p50 1.00×") {
		t.Fatalf("verdict:\n%s", strings.Join(lines, "\n"))
	}
}
