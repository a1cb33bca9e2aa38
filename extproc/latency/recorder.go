package latency

import "time"

// Recorder receives predictions and the latencies that check them: the
// picker's metrics, or the benchmark's per-request results.
type Recorder interface {
	// Predicted is the estimate for the endpoint a request was routed to.
	Predicted(requestID, model string, e Estimate)
	// ObservedTTFT and ObservedTPOT pair a prediction with what happened.
	ObservedTTFT(requestID, model string, predicted, actual time.Duration)
	ObservedTPOT(requestID, model string, predicted, actual time.Duration)
}

// recorderService is the plugin handle's service key of the Recorder; only
// WithRecorder and RecorderFrom use it, so no binary can misspell it.
const recorderService = "latency-recorder"

// WithRecorder offers r to latency plugins through a handle's services.
func WithRecorder(services map[string]any, r Recorder) {
	services[recorderService] = r
}

// RecorderFrom returns the offered Recorder, or one that records nothing.
func RecorderFrom(services map[string]any) Recorder {
	if r, ok := services[recorderService].(Recorder); ok {
		return r
	}
	return discard{}
}

type discard struct{}

func (discard) Predicted(string, string, Estimate)                        {}
func (discard) ObservedTTFT(string, string, time.Duration, time.Duration) {}
func (discard) ObservedTPOT(string, string, time.Duration, time.Duration) {}
