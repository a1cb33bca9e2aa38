package kvwire

import "strings"

// TopicPrefix starts llm-d's topic convention kv@<ip:port>@<model>.
const TopicPrefix = "kv@"

// BuildTopic is the topic a server publishing for endpoint (ip:port) and
// model uses under llm-d's convention. It lives beside ParseTopic so that
// the simulator that publishes and the picker that subscribes cannot
// disagree on the format.
func BuildTopic(endpoint, model string) string {
	return TopicPrefix + endpoint + "@" + model
}

// ParseTopic splits a kv@<ip:port>@<model> topic. The endpoint ends at the
// first '@' after the prefix, since a host:port has none and a model name
// may; the model may be missing, as some publishers leave it out. ok is
// false unless the topic has the prefix and a non-empty endpoint.
func ParseTopic(topic string) (endpoint, model string, ok bool) {
	rest, ok := strings.CutPrefix(topic, TopicPrefix)
	if !ok {
		return "", "", false
	}
	endpoint, model, _ = strings.Cut(rest, "@")
	if endpoint == "" {
		return "", "", false
	}
	return endpoint, model, true
}
