package server

import (
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/kvevents"
)

// A command line built from Options parses back to the same Options.
func TestArgsRoundTrip(t *testing.T) {
	full := Options{
		Host: "127.0.0.1", Port: 8123, AdvertiseHost: "10.0.0.1", Model: "m", ServedModelNames: []string{"a", "b"},
		TokenizerDir: "/tok", Preset: "llama-3.1-8b-h100", BlockSize: 32, NumGPUBlocks: 600, MaxNumSeqs: 8,
		MaxNumBatchedTokens: 4096, MaxModelLen: 2048, MaxWaiting: 10, HashSeed: "7",
		LoRAModules: []LoRAModule{{Name: "l1", Path: "/p1"}, {Name: "l2", Path: "/p2"}}, MaxLoRAs: 2,
		HeldBlockTimeout: time.Minute, Role: RolePrefill, TimeScale: 0.03, FailureRate: 0.25, Seed: 3,
		Echo: true, DefaultMaxTokens: 5, KVEventsEndpoint: "tcp://127.0.0.1:5557",
		KVEventsReplayEndpoint: "tcp://*:5558", KVEventsTopic: "kv@x@m", KVEventsEncoding: kvevents.EncodingMap,
	}
	notFlags := map[string]bool{"Tokenizer": true, "TokenizerCacheBytes": true, "MaxRequestBodyBytes": true, "Logger": true}
	v := reflect.ValueOf(full)
	for i := range v.NumField() {
		if name := v.Type().Field(i).Name; !notFlags[name] && v.Field(i).IsZero() {
			t.Errorf("field %s not set in the round-trip options", name)
		}
	}
	for _, o := range []Options{DefaultOptions(), full} {
		got, err := ParseFlags(o.Args(), io.Discard)
		if err != nil {
			t.Fatalf("ParseFlags(%q): %v", o.Args(), err)
		}
		got.Logger, o.Logger = nil, nil
		want := o // the fields without a flag keep their defaults
		want.TokenizerCacheBytes, want.MaxRequestBodyBytes = got.TokenizerCacheBytes, got.MaxRequestBodyBytes
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("ParseFlags(%q) =\n%+v, want\n%+v", o.Args(), got, want)
		}
	}
}
