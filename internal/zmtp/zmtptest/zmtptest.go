// Package zmtptest holds test helpers for code that speaks ZMTP through
// internal/zmtp.
package zmtptest

import (
	"context"
	"time"

	"github.com/kvgate/kvgate/internal/zmtp"
)

// Subscriber is a SUB-side connection handler (for zmtp.Listen or
// zmtp.Redial): it subscribes to every topic, within sendTimeout when that
// is positive, and forwards each message to msgs until the connection or
// ctx ends.
func Subscriber(msgs chan<- zmtp.Msg, sendTimeout time.Duration) func(context.Context, *zmtp.Conn) {
	return func(ctx context.Context, c *zmtp.Conn) {
		var deadline time.Time
		if sendTimeout > 0 {
			deadline = time.Now().Add(sendTimeout)
		}
		if err := c.SendSubscribe(deadline, nil); err != nil {
			return
		}
		for {
			m, err := c.Recv()
			if err != nil {
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}
}
