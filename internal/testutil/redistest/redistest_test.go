package redistest

import "testing"

func TestStartAnswersPing(t *testing.T) {
	s := Start(t)
	if err := ping(s.Addr); err != nil {
		t.Fatalf("ping %s: %v", s.Addr, err)
	}
}
