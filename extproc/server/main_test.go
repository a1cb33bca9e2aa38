package server

import (
	"log/slog"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	// The handler logs every malformed stream the tests provoke.
	slog.SetDefault(slog.New(slog.DiscardHandler))
	os.Exit(m.Run())
}
