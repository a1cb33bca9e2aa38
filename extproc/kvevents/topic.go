package kvevents

import "strings"

// TopicPrefix starts llm-d's topic convention kv@<ip:port>@<model>.
const TopicPrefix = "kv@"

// Topic returns the topic a server publishing for endpoint (ip:port) and
// model uses under llm-d's convention.
func Topic(endpoint, model string) string {
	return TopicPrefix + endpoint + "@" + model
}

// EndpointOfTopic extracts the ip:port from a kv@<ip:port>@<model> topic.
// The model part may be missing or contain '@'.
func EndpointOfTopic(topic string) (string, bool) {
	rest, ok := strings.CutPrefix(topic, TopicPrefix)
	if !ok {
		return "", false
	}
	ep, _, _ := strings.Cut(rest, "@")
	return ep, ep != ""
}
