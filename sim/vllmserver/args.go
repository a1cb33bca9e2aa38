package vllmserver

import (
	"strconv"
	"strings"
	"time"
)

// Args is the command line (after `kvgate sim`) that parses back to o: a
// flag for each field that differs from DefaultOptions. Fields without a
// flag (Tokenizer, TokenizerCacheBytes, MaxRequestBodyBytes, Logger) are
// not carried; TestArgsRoundTrip fails when a flag field is missing here.
func (o Options) Args() []string {
	d := DefaultOptions()
	var args []string
	add := func(name, v, def string) {
		if v != def {
			args = append(args, "--"+name+"="+v)
		}
	}
	str := add
	num := func(name string, v, def int) { add(name, strconv.Itoa(v), strconv.Itoa(def)) }
	float := func(name string, v, def float64) {
		add(name, strconv.FormatFloat(v, 'g', -1, 64), strconv.FormatFloat(def, 'g', -1, 64))
	}
	dur := func(name string, v, def time.Duration) { add(name, v.String(), def.String()) }

	str("host", o.Host, d.Host)
	num("port", o.Port, d.Port)
	str("advertise-host", o.AdvertiseHost, d.AdvertiseHost)
	str("model", o.Model, d.Model)
	str("served-model-name", strings.Join(o.ServedModelNames, ","), strings.Join(d.ServedModelNames, ","))
	str("tokenizer", o.TokenizerDir, d.TokenizerDir)
	str("preset", o.Preset, d.Preset)
	num("block-size", o.BlockSize, d.BlockSize)
	num("num-gpu-blocks", o.NumGPUBlocks, d.NumGPUBlocks)
	num("max-num-seqs", o.MaxNumSeqs, d.MaxNumSeqs)
	num("max-num-batched-tokens", o.MaxNumBatchedTokens, d.MaxNumBatchedTokens)
	num("max-model-len", o.MaxModelLen, d.MaxModelLen)
	num("max-waiting", o.MaxWaiting, d.MaxWaiting)
	str("scheduling-policy", o.SchedulingPolicy, d.SchedulingPolicy)
	str("hash-seed", o.HashSeed, d.HashSeed)
	loras := make([]string, len(o.LoRAModules))
	for i, l := range o.LoRAModules {
		loras[i] = l.Name + "=" + l.Path
	}
	str("lora-modules", strings.Join(loras, ","), "")
	num("max-loras", o.MaxLoRAs, d.MaxLoRAs)
	dur("kv-held-timeout", o.HeldBlockTimeout, d.HeldBlockTimeout)
	str("role", string(o.Role), string(d.Role))
	num("mm-tokens-per-item", o.MMTokensPerItem, d.MMTokensPerItem)
	float("time-scale", o.TimeScale, d.TimeScale)
	float("failure-rate", o.FailureRate, d.FailureRate)
	add("seed", strconv.FormatUint(o.Seed, 10), strconv.FormatUint(d.Seed, 10))
	add("echo", strconv.FormatBool(o.Echo), strconv.FormatBool(d.Echo))
	num("default-max-tokens", o.DefaultMaxTokens, d.DefaultMaxTokens)
	str("kv-events-endpoint", o.KVEventsEndpoint, d.KVEventsEndpoint)
	str("kv-events-replay-endpoint", o.KVEventsReplayEndpoint, d.KVEventsReplayEndpoint)
	str("kv-events-topic", o.KVEventsTopic, d.KVEventsTopic)
	str("kv-events-format", o.KVEventsEncoding.String(), d.KVEventsEncoding.String())
	str("agent", o.Agent, d.Agent)
	num("kv-bytes-per-token", o.KVBytesPerToken, d.KVBytesPerToken)
	add("kv-region-bytes", strconv.FormatInt(o.KVRegionBytes, 10), strconv.FormatInt(d.KVRegionBytes, 10))
	str("kv-region-dir", o.KVRegionDir, d.KVRegionDir)
	str("kv-load-failure-policy", o.KVLoadFailurePolicy, d.KVLoadFailurePolicy)
	dur("kv-transfer-timeout", o.KVTransferTimeout, d.KVTransferTimeout)
	str("kv-offload-events-endpoint", o.KVOffloadEventsEndpoint, d.KVOffloadEventsEndpoint)
	str("kv-transfer-config", o.KVTransferConfig, d.KVTransferConfig)
	str("kv-allowed-hosts", strings.Join(o.KVAllowedHosts, ","), "")
	return args
}
