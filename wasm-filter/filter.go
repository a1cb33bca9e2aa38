package main

import (
	"strconv"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvgate/kvgate/internal/hints"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/tokenizer"
)

func main() {}

func init() {
	proxywasm.SetVMContext(&vmContext{})
}

// vmContext holds what all plugins of a VM share: the tokenizer, loaded
// once in OnVMStart (the only time the VM configuration is readable).
type vmContext struct {
	types.DefaultVMContext
	tok *tokenizer.Tokenizer
}

func (v *vmContext) OnVMStart(int) types.OnVMStartStatus {
	data, err := proxywasm.GetVMConfiguration()
	if err != nil && err != types.ErrorStatusNotFound {
		proxywasm.LogCriticalf("kvgate-filter: reading VM configuration: %v", err)
		return types.OnVMStartStatusFailed
	}
	if v.tok, err = loadTokenizer(data); err != nil {
		proxywasm.LogCriticalf("kvgate-filter: %v", err)
		return types.OnVMStartStatusFailed
	}
	return types.OnVMStartStatusOK
}

func (v *vmContext) NewPluginContext(uint32) types.PluginContext {
	return &pluginContext{vm: v}
}

// pluginContext holds one plugin configuration. A VM runs one request
// callback at a time, so its fields need no locking; they are written only
// in OnPluginStart.
type pluginContext struct {
	types.DefaultPluginContext
	vm     *vmContext
	cfg    config
	hasher prefixHasher
}

func (p *pluginContext) OnPluginStart(int) types.OnPluginStartStatus {
	data, err := proxywasm.GetPluginConfiguration()
	if err != nil && err != types.ErrorStatusNotFound {
		proxywasm.LogCriticalf("kvgate-filter: reading plugin configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	if p.cfg, err = parseConfig(data); err != nil {
		proxywasm.LogCriticalf("kvgate-filter: %v", err)
		return types.OnPluginStartStatusFailed
	}
	if p.hasher, err = newHasher(p.cfg, p.vm.tok); err != nil {
		proxywasm.LogCriticalf("kvgate-filter: %v", err)
		return types.OnPluginStartStatusFailed
	}
	proxywasm.LogInfof("kvgate-filter: mode=%s blockSize=%d maxPrefixBlocks=%d maxBodyBytes=%d",
		p.cfg.Mode, p.cfg.BlockSize, p.cfg.MaxPrefixBlocks, p.cfg.MaxBodyBytes)
	return types.OnPluginStartStatusOK
}

func (p *pluginContext) NewHttpContext(uint32) types.HttpContext {
	return &httpContext{plugin: p}
}

// httpContext is one request. buffering is true from the headers of an
// OpenAI request with a body until the filter either tags it or gives up.
type httpContext struct {
	types.DefaultHttpContext
	plugin    *pluginContext
	api       openai.API
	buffering bool
}

func (h *httpContext) OnHttpRequestHeaders(_ int, endOfStream bool) types.Action {
	if err := stripHints(); err != nil {
		// Forged hints could reach the picker: refuse rather than route
		// on them.
		proxywasm.LogErrorf("kvgate-filter: stripping x-kvgate headers: %v", err)
		_ = proxywasm.SendHttpResponse(500, nil, []byte("kvgate-filter: cannot sanitize request headers"), -1)
		return types.ActionPause
	}
	if endOfStream {
		return types.ActionContinue
	}
	path, err := proxywasm.GetHttpRequestHeader(":path")
	if err != nil {
		return types.ActionContinue
	}
	api, ok := openai.APIFromPath(path)
	if !ok {
		return types.ActionContinue
	}
	if cl, err := proxywasm.GetHttpRequestHeader("content-length"); err == nil {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n > int64(h.plugin.cfg.MaxBodyBytes) {
			proxywasm.LogDebugf("kvgate-filter: body of %d bytes over the limit, not tagged", n)
			return types.ActionContinue
		}
	}
	h.api = api
	h.buffering = true
	// Hold the headers back: the hints are written once the body is in.
	return types.ActionPause
}

// stripHints removes every x-kvgate-* request header, one call per
// occurrence so that repeated headers all go whichever way the host
// implements removal.
func stripHints() error {
	headers, err := proxywasm.GetHttpRequestHeaders()
	if err != nil {
		return err
	}
	for _, kv := range headers {
		if hints.IsHintHeader(kv[0]) {
			if err := proxywasm.RemoveHttpRequestHeader(kv[0]); err != nil {
				return err
			}
		}
	}
	return nil
}

func (h *httpContext) OnHttpRequestBody(bodySize int, endOfStream bool) types.Action {
	if !h.buffering {
		return types.ActionContinue
	}
	if bodySize > h.plugin.cfg.MaxBodyBytes {
		// Release what the host has buffered; the request goes untagged.
		h.buffering = false
		proxywasm.LogDebugf("kvgate-filter: body over %d bytes, not tagged", h.plugin.cfg.MaxBodyBytes)
		return types.ActionContinue
	}
	if !endOfStream {
		return types.ActionPause
	}
	h.buffering = false
	body, err := proxywasm.GetHttpRequestBody(0, bodySize)
	if err != nil {
		proxywasm.LogWarnf("kvgate-filter: reading body: %v", err)
		return types.ActionContinue
	}
	hs, err := tag(h.plugin.hasher, h.api, body)
	if err != nil {
		proxywasm.LogDebugf("kvgate-filter: not tagged: %v", err)
		return types.ActionContinue
	}
	hs.Encode(func(name, value string) {
		if err == nil {
			err = proxywasm.ReplaceHttpRequestHeader(name, value)
		}
	})
	if err != nil {
		// A partial set would read as malformed; leave none instead.
		proxywasm.LogWarnf("kvgate-filter: setting hints: %v", err)
		if err := stripHints(); err != nil {
			proxywasm.LogErrorf("kvgate-filter: stripping partial hints: %v", err)
		}
	}
	return types.ActionContinue
}
