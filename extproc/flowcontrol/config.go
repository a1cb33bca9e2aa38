package flowcontrol

import (
	"errors"
	"fmt"
	"time"
)

// Defaults, as in llm-d's router.
const (
	// DefaultRequestTTL bounds queue wait when the configuration sets none.
	DefaultRequestTTL = 60 * time.Second
	// DefaultBandMaxBytes and DefaultBandMaxRequests bound a band whose
	// configuration leaves them out (or sets 0): every band is bounded.
	DefaultBandMaxBytes    = 1_000_000_000
	DefaultBandMaxRequests = 5000
	// MaxBands bounds the bands provisioned for priorities the
	// configuration does not list.
	MaxBands = 256
	// MaxFlowsPerBand bounds a band's flows; later fairness ids share
	// OtherFairnessID.
	MaxFlowsPerBand = 1000
	// OtherFairnessID is the flow of fairness ids beyond the bound.
	OtherFairnessID = "other"
)

// BandConfig configures one priority band.
type BandConfig struct {
	Priority int
	// MaxBytes and MaxRequests bound the band's queued requests; 0 takes
	// DefaultBandMaxBytes / DefaultBandMaxRequests.
	MaxBytes    int64
	MaxRequests int64
	Fairness    FairnessPolicy
	Ordering    OrderingPolicy
}

// Config is a Controller's configuration.
type Config struct {
	// MaxBytes and MaxRequests bound all queued requests together; 0 is
	// unlimited.
	MaxBytes    int64
	MaxRequests int64
	// RequestTTL bounds queue wait while the pool has endpoints,
	// NoEndpointTTL while it has none; 0 is no bound (the request waits
	// for dispatch, its client or shutdown). A change between the two
	// regimes starts a fresh budget.
	RequestTTL    time.Duration
	NoEndpointTTL time.Duration
	// Bands are the configured bands; other priorities get bands from
	// DefaultBand (priority >= 0) or DefaultNegativeBand (priority < 0).
	Bands               []BandConfig
	DefaultBand         BandConfig
	DefaultNegativeBand BandConfig
	UsageLimit          UsageLimitPolicy
	Detector            SaturationDetector
	// DetectorName labels flow_control_stale_endpoints.
	DetectorName string
	// EnableEviction revokes in-flight sheddable requests (priority < 0)
	// while a band with queued demand is blocked by saturation.
	EnableEviction bool
}

// Validate reports the first invalid field.
func (c *Config) Validate() error {
	switch {
	case c.MaxBytes < 0 || c.MaxRequests < 0:
		return errors.New("maxBytes and maxRequests must not be negative")
	case c.RequestTTL < 0 || c.NoEndpointTTL < 0:
		return errors.New("request TTLs must not be negative")
	case c.UsageLimit == nil:
		return errors.New("a usage-limit policy is required")
	case c.Detector == nil:
		return errors.New("a saturation detector is required")
	}
	seen := map[int]bool{}
	for i := range c.Bands {
		b := &c.Bands[i]
		if seen[b.Priority] {
			return fmt.Errorf("priorityBands: priority %d is configured twice", b.Priority)
		}
		seen[b.Priority] = true
		if err := b.validate(); err != nil {
			return fmt.Errorf("priorityBands[%d] (priority %d): %w", i, b.Priority, err)
		}
	}
	if err := c.DefaultBand.validate(); err != nil {
		return fmt.Errorf("defaultPriorityBand: %w", err)
	}
	if err := c.DefaultNegativeBand.validate(); err != nil {
		return fmt.Errorf("defaultNegativePriorityBand: %w", err)
	}
	if len(c.Bands) > MaxBands {
		return fmt.Errorf("priorityBands: at most %d bands, got %d", MaxBands, len(c.Bands))
	}
	return nil
}

func (b *BandConfig) validate() error {
	switch {
	case b.MaxBytes < 0 || b.MaxRequests < 0:
		return errors.New("maxBytes and maxRequests must not be negative")
	case b.Fairness == nil || b.Ordering == nil:
		return errors.New("fairness and ordering policies are required")
	}
	return nil
}

func (b BandConfig) limits() (maxBytes, maxRequests int64) {
	maxBytes, maxRequests = b.MaxBytes, b.MaxRequests
	if maxBytes == 0 {
		maxBytes = DefaultBandMaxBytes
	}
	if maxRequests == 0 {
		maxRequests = DefaultBandMaxRequests
	}
	return maxBytes, maxRequests
}
