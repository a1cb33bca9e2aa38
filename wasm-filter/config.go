package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/kvgate/kvgate/internal/hints"
	"github.com/kvgate/kvgate/internal/kvhash"
)

// config is the plugin configuration.
type config struct {
	Mode string `json:"mode"`
	// BlockSize is in tokens; approximate mode hashes BlockSize×4 bytes.
	BlockSize int `json:"blockSize"`
	// MaxPrefixBlocks bounds the hashed blocks. The default follows the
	// picker scorer the mode feeds: 256 (GIE's prefix-cache-scorer) in
	// approximate mode, 8192 (precise-prefix-cache-scorer's
	// maxBlocksToMatch) in precise mode; both sides must agree.
	MaxPrefixBlocks int `json:"maxPrefixBlocks"`
	// MaxBodyBytes bounds the buffered body; larger requests pass untagged.
	MaxBodyBytes int `json:"maxBodyBytes"`
	// DenseBlocks is the most leading blocks sent densely in the prefix
	// header (see internal/hints); above it the sample thins out.
	DenseBlocks int `json:"denseBlocks"`
	// HashSeed is the model servers' PYTHONHASHSEED (precise mode only).
	HashSeed string `json:"hashSeed"`

	mode hints.Mode
}

// defaultMaxPrefixBlocks per mode; see config.MaxPrefixBlocks.
var defaultMaxPrefixBlocks = map[hints.Mode]int{hints.Approximate: 256, hints.Precise: 8192}

func defaultConfig() config {
	return config{
		Mode:         "approximate",
		BlockSize:    kvhash.DefaultBlockSize,
		MaxBodyBytes: 8 << 20,
		DenseBlocks:  256,
		mode:         hints.Approximate,
	}
}

// parseConfig reads the plugin configuration; empty means all defaults.
// Unknown fields are errors so that a typo does not silently change
// routing.
func parseConfig(data []byte) (config, error) {
	c := defaultConfig()
	if len(bytes.TrimSpace(data)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return config{}, fmt.Errorf("plugin configuration: %w", err)
		}
	}
	var err error
	if c.mode, err = hints.ParseMode(c.Mode); err != nil {
		return config{}, fmt.Errorf("plugin configuration: %w", err)
	}
	if c.MaxPrefixBlocks == 0 {
		c.MaxPrefixBlocks = defaultMaxPrefixBlocks[c.mode]
	}
	switch {
	case c.BlockSize < 1 || c.BlockSize > hints.MaxBlockSize:
		return config{}, fmt.Errorf("plugin configuration: blockSize %d out of [1, %d]", c.BlockSize, hints.MaxBlockSize)
	case c.MaxPrefixBlocks < 1 || c.MaxPrefixBlocks > hints.MaxBlocks:
		return config{}, fmt.Errorf("plugin configuration: maxPrefixBlocks %d out of [1, %d]", c.MaxPrefixBlocks, hints.MaxBlocks)
	case c.MaxBodyBytes < 1:
		return config{}, fmt.Errorf("plugin configuration: maxBodyBytes %d < 1", c.MaxBodyBytes)
	case c.DenseBlocks < 1 || c.DenseBlocks > hints.MaxDense:
		return config{}, fmt.Errorf("plugin configuration: denseBlocks %d out of [1, %d]", c.DenseBlocks, hints.MaxDense)
	}
	return c, nil
}
