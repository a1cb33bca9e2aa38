package vllmserver

import (
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/kvwire"
)

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  string
		check func(o Options) bool
		err   string
	}{
		{name: "defaults", args: "", check: func(o Options) bool {
			return o.Port == 8000 && o.Model == "Qwen/Qwen3-0.6B" && o.HashSeed == "42" && o.BlockSize == 16 &&
				o.Role == RoleBoth && o.TimeScale == 1 && o.KVEventsEncoding == kvwire.EncodingArray
		}},
		{name: "positional model", args: "meta-llama/Llama-3.1-8B-Instruct --port 8001", check: func(o Options) bool {
			return o.Model == "meta-llama/Llama-3.1-8B-Instruct" && o.Port == 8001
		}},
		{name: "vllm lists", args: "--served-model-name a b --lora-modules x=/p/x y=/p/y --max-loras 2 --port 1", check: func(o Options) bool {
			return reflect.DeepEqual(o.ServedModelNames, []string{"a", "b"}) && o.Port == 1 && o.MaxLoRAs == 2 &&
				reflect.DeepEqual(o.LoRAModules, []LoRAModule{{"x", "/p/x"}, {"y", "/p/y"}})
		}},
		{name: "repeated and comma lists", args: "--served-model-name=a,b --served-model-name c", check: func(o Options) bool {
			return reflect.DeepEqual(o.ServedModelNames, []string{"a", "b", "c"})
		}},
		{name: "events", args: "--kv-events-endpoint tcp://*:5557 --kv-events-format map --kv-events-topic t --role decode --time-scale 10", check: func(o Options) bool {
			return o.KVEventsEndpoint == "tcp://*:5557" && o.KVEventsEncoding == kvwire.EncodingMap &&
				o.KVEventsTopic == "t" && o.Role == RoleDecode && o.TimeScale == 10
		}},
		{name: "bad role", args: "--role middle", err: "--role"},
		{name: "bad format", args: "--kv-events-format json", err: "unknown encoding"},
		{name: "bad lora", args: "--lora-modules noequals", err: "name=path"},
		{name: "bad scale", args: "--time-scale 0", err: "--time-scale"},
		{name: "bad failure rate", args: "--failure-rate 2", err: "--failure-rate"},
		{name: "name clash", args: "--served-model-name a --lora-modules a=/p", err: "used twice"},
		{name: "stray", args: "--port 1 extra", err: "unexpected arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := ParseFlags(strings.Fields(tc.args), io.Discard)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !tc.check(o) {
				t.Fatalf("options %+v, err %v", o, err)
			}
		})
	}
}
