// Package progress draws the text progress bars of `kvgate up` and
// `kvgate bench`.
package progress

import (
	"io"
	"os"
	"strings"

	"golang.org/x/term"
)

// Width is a bar's length in characters between its brackets.
const Width = 40

// Bar renders done of total as [####....], Width characters inside.
func Bar(done, total int) string {
	n := 0
	if total > 0 {
		n = min(max(Width*done/total, 0), Width)
	}
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", Width-n) + "]"
}

// IsTerminal reports whether w is a terminal, where a bar can be redrawn
// in place with a carriage return.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
