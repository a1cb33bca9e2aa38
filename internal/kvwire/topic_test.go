package kvwire

import (
	"strings"
	"testing"
)

func TestParseTopic(t *testing.T) {
	type want struct{ endpoint, model string }
	for topic, w := range map[string]want{
		"kv@10.0.0.1:8000@Qwen/Qwen3-0.6B": {"10.0.0.1:8000", "Qwen/Qwen3-0.6B"},
		"kv@[fd00::1]:8000@m":              {"[fd00::1]:8000", "m"},
		"kv@10.0.0.1:8000":                 {"10.0.0.1:8000", ""},
		"kv@10.0.0.1:8000@m@v2":            {"10.0.0.1:8000", "m@v2"},
		"kv@@m":                            {},
		"":                                 {},
		"vllm":                             {},
	} {
		ep, model, ok := ParseTopic(topic)
		if ep != w.endpoint || model != w.model || ok != (w.endpoint != "") {
			t.Errorf("ParseTopic(%q) = %q, %q, %v; want %q, %q", topic, ep, model, ok, w.endpoint, w.model)
		}
	}
	if got := BuildTopic("10.0.0.1:8000", "m"); got != "kv@10.0.0.1:8000@m" {
		t.Fatalf("BuildTopic = %q", got)
	}
}

func FuzzParseTopic(f *testing.F) {
	f.Add("kv@10.0.0.1:8000@Qwen/Qwen3-0.6B")
	f.Add("kv@")
	f.Add("@@")
	f.Fuzz(func(t *testing.T, topic string) {
		ep, model, ok := ParseTopic(topic)
		if ok && (ep == "" || strings.Contains(ep, "@")) {
			t.Fatalf("ParseTopic(%q) = %q", topic, ep)
		}
		if ok {
			if again, m, ok2 := ParseTopic(BuildTopic(ep, model)); !ok2 || again != ep || m != model {
				t.Fatalf("round trip of %q, %q gave %q, %q", ep, model, again, m)
			}
		}
	})
}
