package endpoints

import "testing"

func TestParseRankName(t *testing.T) {
	tests := []struct {
		name   string
		server string
		rank   int
		ok     bool
	}{
		{RankName("vllm-0", 3), "vllm-0", 3, true},
		{RankName("a-rank-1", 0), "a-rank-1", 0, true},
		{"vllm-0", "", 0, false},
		{"vllm-rank-", "", 0, false},
		{"-rank-1", "", 0, false},
		{"vllm-rank-01", "", 0, false},
		{"vllm-rank--1", "", 0, false},
		{"vllm-rank-1x", "", 0, false},
	}
	for _, tt := range tests {
		server, rank, ok := ParseRankName(tt.name)
		if server != tt.server || rank != tt.rank || ok != tt.ok {
			t.Errorf("ParseRankName(%q) = %q, %d, %v; want %q, %d, %v", tt.name, server, rank, ok, tt.server, tt.rank, tt.ok)
		}
	}
}
