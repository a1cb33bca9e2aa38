// Package endpointnotification is llm-d's endpoint-notification-source: the
// data-layer source that tells extractors when endpoints join and leave the
// pool. In kvgate the datastore already does (extproc/endpoints): the picker
// subscribes to a joining endpoint's KV events and drops a leaving one's
// index entries. The source makes the dataLayer wiring llm-d's precise
// configurations use (sources: endpoint-notification-source → extractors:
// precise-prefix-cache-producer) valid; only the precise prefix plugins
// accept it as their source.
//
// Parameters: none.
package endpointnotification

import (
	"encoding/json"

	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Type is the registered plugin type.
const Type = "endpoint-notification-source"

// Source implements endpoint-notification-source.
type Source struct{ scheduling.Named }

// New is the plugin factory.
func New(name string, params json.RawMessage, _ *scheduling.Handle) (scheduling.Plugin, error) {
	n, err := scheduling.NoParams(Type, name, params)
	if err != nil {
		return nil, err
	}
	return &Source{n}, nil
}

// DataLayerSource implements scheduling.DataSource.
func (s *Source) DataLayerSource() {}

// EndpointNotifications marks the source the precise plugins read.
func (s *Source) EndpointNotifications() {}

var _ scheduling.DataSource = (*Source)(nil)
