package repo

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRoot(t *testing.T) {
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("root %s has no go.mod: %v", root, err)
	}
	if want, _ := filepath.Abs(filepath.Join("..", "..")); root != want {
		t.Fatalf("root %s, want %s", root, want)
	}
	t.Chdir(t.TempDir())
	if _, err := Root(); err != ErrNoRoot {
		t.Fatalf("outside a checkout: %v, want ErrNoRoot", err)
	}
}
