package autoscale

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/batch/async"
)

// Demand is a fleet's offered load as the picker's metrics measure it.
type Demand struct {
	// Rate is requests per second.
	Rate float64 `json:"requests_per_second"`
	// PromptTokens and OutputTokens are the mean tokens per request.
	PromptTokens float64 `json:"prompt_tokens"`
	OutputTokens float64 `json:"output_tokens"`
}

// The PromQL of MeasuredDemand, over the picker's llm_d_epp_* request
// metrics; %s is the window and the optional label selector.
const (
	demandRateQuery   = `sum(rate(llm_d_epp_request_total%[2]s[%[1]s]))`
	demandPromptQuery = `sum(rate(llm_d_epp_request_input_tokens_sum%[2]s[%[1]s])) / sum(rate(llm_d_epp_request_input_tokens_count%[2]s[%[1]s]))`
	demandOutputQuery = `sum(rate(llm_d_epp_request_output_tokens_sum%[2]s[%[1]s])) / sum(rate(llm_d_epp_request_output_tokens_count%[2]s[%[1]s]))`
)

// MeasuredDemand asks a Prometheus server (its base URL) for the live
// fleet's demand over window; selector, when not empty, is a label
// selector like {namespace="x",model_name="m"} applied to every series.
func MeasuredDemand(ctx context.Context, client *http.Client, base string, window time.Duration, selector string) (Demand, error) {
	if window < time.Second {
		return Demand{}, fmt.Errorf("demand window must be at least 1s, got %v", window)
	}
	w := strconv.Itoa(int(window.Seconds())) + "s"
	var d Demand
	for _, q := range []struct {
		query string
		dst   *float64
	}{{demandRateQuery, &d.Rate}, {demandPromptQuery, &d.PromptTokens}, {demandOutputQuery, &d.OutputTokens}} {
		expr := fmt.Sprintf(q.query, w, selector)
		v, err := (&async.PromQL{URL: base, Query: expr, Client: client}).Read(ctx)
		if err != nil {
			return Demand{}, err
		}
		*q.dst = v
	}
	if !(d.Rate > 0) || !(d.PromptTokens > 0) || !(d.OutputTokens > 0) {
		return Demand{}, fmt.Errorf("the fleet shows no demand over %s: %+v", w, d)
	}
	return d, nil
}
