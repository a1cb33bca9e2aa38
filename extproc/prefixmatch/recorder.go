package prefixmatch

import "github.com/kvgate/kvgate/extproc/scheduling"

// Recorder receives the prefix scorers' predictions, so that their accuracy
// is visible: how much of a routed prompt the plugin expected the chosen
// endpoint to have cached, and, once the response's usage is known, how much
// it really had.
type Recorder interface {
	PrefixPredicted(plugin scheduling.TypedName, predictedTokens, promptTokens int)
	PrefixActual(plugin scheduling.TypedName, predictedTokens, actualTokens int)
}

// ServiceRecorder is the handle service key of the Recorder. It is a service
// rather than a Handle field so that the framework carries no prefix-specific
// dependency; a binary without one records nothing.
const ServiceRecorder = "prefix-recorder"

// RecorderOf returns the handle's recorder, or one that discards.
func RecorderOf(h *scheduling.Handle) Recorder {
	if rec, ok := scheduling.Service[Recorder](h, ServiceRecorder); ok && rec != nil {
		return rec
	}
	return discard{}
}

type discard struct{}

func (discard) PrefixPredicted(scheduling.TypedName, int, int) {}
func (discard) PrefixActual(scheduling.TypedName, int, int)    {}
