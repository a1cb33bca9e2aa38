package endpointnotification

import (
	"testing"

	"github.com/kvgate/kvgate/extproc/scheduling"
)

func TestNew(t *testing.T) {
	p, err := New("notifications", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.(scheduling.DataSource); !ok || p.TypedName().Name != "notifications" {
		t.Fatalf("plugin %v", p.TypedName())
	}
	if _, err := New("", []byte(`{"resync": "1m"}`), nil); err == nil {
		t.Fatal("parameters accepted")
	}
}
