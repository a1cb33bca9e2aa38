package dataparallel_test

import (
	"context"
	"errors"
	"testing"

	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/plugins/all"
	"github.com/kvgate/kvgate/extproc/scheduling"
	"github.com/kvgate/kvgate/extproc/scheduling/schedtest"
)

// A profile whose filters leave no endpoint fails the cycle with the
// profile's error under data-parallel-profile-handler as under
// single-profile-handler, so that the director answers it alike (429,
// rejected-saturated) rather than as a handler failure (500).
func TestAllFilteredLikeSingle(t *testing.T) {
	eps := []*endpoints.Endpoint{schedtest.Endpoint("d", endpoints.Metrics{}, endpoints.RoleLabel, "decode")}
	for _, handler := range []string{"single-profile-handler", "data-parallel-profile-handler"} {
		t.Run(handler, func(t *testing.T) {
			c, err := config.Parse([]byte("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: " + handler + "\n- type: prefill-filter\nschedulingProfiles:\n- name: default\n  plugins: [{pluginRef: prefill-filter}]\n"))
			if err != nil {
				t.Fatal(err)
			}
			b, err := config.Build(c, all.Registry(), &scheduling.Handle{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = b.Scheduler.Schedule(context.Background(), scheduling.NewCycleState(), &scheduling.Request{ID: "r"}, eps)
			if !errors.Is(err, scheduling.ErrAllFiltered) {
				t.Fatalf("Schedule: %v, want ErrAllFiltered", err)
			}
		})
	}
}
