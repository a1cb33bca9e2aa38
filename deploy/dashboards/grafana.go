package dashboards

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// grafanaPanel is the part of a Grafana panel the check reads; rows that
// are collapsed hold their panels inside.
type grafanaPanel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"`
}

// ParseGrafana reads a Grafana dashboard JSON model and returns its panels
// with their Prometheus queries, under the rows they sit in. A panel with a
// target but no expr is an error: its query would go unchecked.
func ParseGrafana(r io.Reader) ([]Panel, error) {
	var d struct {
		Title  string         `json:"title"`
		Panels []grafanaPanel `json:"panels"`
	}
	if err := json.NewDecoder(r).Decode(&d); err != nil {
		return nil, fmt.Errorf("grafana dashboard: %w", err)
	}
	if d.Title == "" {
		return nil, fmt.Errorf("grafana dashboard without a title")
	}
	var out []Panel
	var walk func(ps []grafanaPanel, row string) error
	walk = func(ps []grafanaPanel, row string) error {
		for _, p := range ps {
			if p.Type == "row" {
				row = p.Title
				if err := walk(p.Panels, row); err != nil {
					return err
				}
				continue
			}
			panel := Panel{Dashboard: d.Title, Row: row, Title: p.Title}
			for i, t := range p.Targets {
				e := strings.TrimSpace(t.Expr)
				if e == "" {
					return fmt.Errorf("%s / %s: target %d has no expr", d.Title, p.Title, i)
				}
				panel.Exprs = append(panel.Exprs, e)
			}
			if len(panel.Exprs) > 0 {
				out = append(out, panel)
			}
		}
		return nil
	}
	if err := walk(d.Panels, ""); err != nil {
		return nil, err
	}
	return out, nil
}
