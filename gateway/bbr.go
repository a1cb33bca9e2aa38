package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/bytebudget"
	"github.com/kvgate/kvgate/internal/openai"
)

// Body-based routing is what GIE's Body-Based Router (BBR, an ext_proc
// server in front of the picker) does with its default configuration: its
// body-field-to-header plugin copies the body's "model" into
// X-Gateway-Model-Name, so that HTTPRoutes can match on the model. The
// stand-in runs it as a built-in step before the picker and exports BBR's
// metrics under BBR's names, so that GIE's dashboard reads them unchanged.
const (
	// HeaderGatewayModelName is the header BBR writes.
	HeaderGatewayModelName = "x-gateway-model-name"
	// bbrModelField is the body field BBR's default configuration reads.
	bbrModelField = "model"
	// bbrPluginType names the step as BBR's default plugin is named (type
	// and name alike), in bbr_plugin_duration_seconds' labels.
	bbrPluginType = "body-field-to-header"
)

// BBRMetrics are BBR's metric families. Both generations are exported:
// bbr_model_not_in_body_total / bbr_model_not_parsed_total (GIE's
// dashboard reads these) and, for the same events, the newer
// bbr_body_field_not_found_total / bbr_body_field_empty_total{field}.
type BBRMetrics struct {
	success, notInBody, notParsed prometheus.Counter
	fieldNotFound, fieldEmpty     prometheus.Counter
	duration                      prometheus.Observer
}

// bbrDurationBuckets are BBR's (seconds).
var bbrDurationBuckets = []float64{0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1}

// NewBBRMetrics registers BBR's families on reg. Every series exists from
// the start, so a dashboard reads 0 rather than nothing.
func NewBBRMetrics(reg prometheus.Registerer) (*BBRMetrics, error) {
	var cs []prometheus.Collector
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Subsystem: "bbr", Name: name, Help: help})
		cs = append(cs, c)
		return c
	}
	field := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "bbr", Name: name, Help: help}, []string{"field"})
		cs = append(cs, c)
		return c.WithLabelValues(bbrModelField)
	}
	dur := prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: "bbr", Name: "plugin_duration_seconds",
		Help:    "Plugin processing latency distribution in seconds for each extension point, plugin type and plugin name.",
		Buckets: bbrDurationBuckets}, []string{"extension_point", "plugin_type", "plugin_name"})
	cs = append(cs, dur)
	m := &BBRMetrics{
		success:       counter("success_total", "Requests whose model was read from the body and set as the X-Gateway-Model-Name header."),
		notInBody:     counter("model_not_in_body_total", "Requests whose body has no model, or an empty one."),
		notParsed:     counter("model_not_parsed_total", "Requests whose body is not a JSON object or whose model is not a string."),
		fieldNotFound: field("body_field_not_found_total", "Requests whose body lacks the field."),
		fieldEmpty:    field("body_field_empty_total", "Requests whose body has the field, empty."),
		duration:      dur.WithLabelValues("request", bbrPluginType, bbrPluginType),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// routeByBody runs the body-based routing step on an OpenAI request with a
// body: it buffers the body (as for the filter, within MaxRequestBuffer;
// 413 above it), sets X-Gateway-Model-Name from its model and counts the
// outcome. A body without a usable model passes on unchanged, as BBR lets
// it: the picker then answers it.
func (g *Gateway) routeByBody(ctx context.Context, req *request) error {
	p, _ := req.headers.get(":path")
	if _, ok := openai.APIFromPath(p); !ok || !req.hasBody {
		return nil
	}
	body, eof, err := bytebudget.ReadUpTo(req.body, g.cfg.MaxRequestBuffer+1, &req.held)
	if err != nil {
		return bodyError(err)
	}
	if !eof {
		return &statusError{status: http.StatusRequestEntityTooLarge, msg: "request body exceeds the buffer limit"}
	}
	req.body, req.whole = bytes.NewReader(body), body
	start := time.Now()
	model, outcome := bodyModel(body)
	g.bbr.duration.Observe(time.Since(start).Seconds())
	switch outcome {
	case bbrSuccess:
		g.bbr.success.Inc()
		req.headers = append(req.headers.without(HeaderGatewayModelName), [2]string{HeaderGatewayModelName, model})
	case bbrNotFound:
		g.bbr.notInBody.Inc()
		g.bbr.fieldNotFound.Inc()
	case bbrEmpty:
		g.bbr.notInBody.Inc()
		g.bbr.fieldEmpty.Inc()
	case bbrNotParsed:
		g.bbr.notParsed.Inc()
	}
	if outcome != bbrSuccess {
		g.log.DebugContext(ctx, "body-based routing: no model header", "outcome", outcome)
	}
	return nil
}

type bbrOutcome string

const (
	bbrSuccess   bbrOutcome = "success"
	bbrNotFound  bbrOutcome = "model_not_in_body"
	bbrEmpty     bbrOutcome = "model_empty"
	bbrNotParsed bbrOutcome = "model_not_parsed"
)

// bodyModel reads the top-level model of a JSON object body.
func bodyModel(body []byte) (string, bbrOutcome) {
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&fields); err != nil || fields == nil {
		return "", bbrNotParsed
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", bbrNotParsed // trailing data after the object
	}
	raw, ok := fields[bbrModelField]
	if !ok || string(raw) == "null" {
		return "", bbrNotFound
	}
	var model string
	if err := json.Unmarshal(raw, &model); err != nil {
		return "", bbrNotParsed
	}
	if model == "" {
		return "", bbrEmpty
	}
	for i := 0; i < len(model); i++ {
		if c := model[i]; c < 0x20 || c == 0x7f {
			return "", bbrNotParsed // no header value can carry it
		}
	}
	return model, bbrSuccess
}
