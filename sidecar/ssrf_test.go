package sidecar

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/staticfile"
	"github.com/kvgate/kvgate/internal/eppwire"
)

// TestSSRFNeverDialsOutsideThePool: with protection on (the default), a
// prefill target, an encoder or a KV source that is not a pool member is
// never dialled, whatever spelling, prefix or form the header uses; pool
// edits take effect without a restart.
func TestSSRFNeverDialsOutsideThePool(t *testing.T) {
	answer := func(w http.ResponseWriter, _ int, _ leg) { writeJSONReply(w, http.StatusOK, prefillAnswer) }
	member := newRecorder(t, answer)
	outsider := newRecorder(t, answer)
	dec := newRecorder(t, answer)
	pool := poolFile(t, member.addr())
	o := testOptions(dec.port(), pool)
	o.ECConnector, o.EnableP2PPull = ECConnectorNIXL, true
	sc, url := startSidecar(t, o)
	chat := map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": "http://img/1.png"}}}}}}
	_, outPort, _ := strings.Cut(outsider.addr(), ":")
	memberHost, memberPort, _ := strings.Cut(member.addr(), ":")

	for _, tc := range []struct {
		name       string
		headers    map[string]string
		wantStatus int
		wantMember int // legs the member gets
	}{
		{"prefiller outside", map[string]string{eppwire.HeaderPrefiller: outsider.addr()}, http.StatusForbidden, 0},
		{"prefiller outside, URL form", map[string]string{eppwire.HeaderPrefiller: "http://" + outsider.addr()}, http.StatusForbidden, 0},
		{"prefiller outside, new name", map[string]string{eppwire.HeaderPrefillerLLMD: outsider.addr()}, http.StatusForbidden, 0},
		{"prefiller by hostname", map[string]string{eppwire.HeaderPrefiller: "localhost:" + outPort}, http.StatusForbidden, 0},
		{"prefiller list, outsider first", map[string]string{eppwire.HeaderPrefiller: outsider.addr() + "," + member.addr()}, http.StatusForbidden, 0},
		{"client's new name loses to the picker's old one", map[string]string{
			eppwire.HeaderPrefiller: member.addr(), eppwire.HeaderPrefillerLLMD: outsider.addr()}, http.StatusOK, 1},
		{"member, IPv4-mapped spelling", map[string]string{eppwire.HeaderPrefiller: "[::ffff:" + memberHost + "]:" + memberPort}, http.StatusOK, 1},
		{"encoder outside dropped, KV source outside ignored", map[string]string{
			eppwire.HeaderPrefiller: member.addr(), eppwire.HeaderEncoders: outsider.addr(),
			eppwire.HeaderKVCacheSource: outsider.addr()}, http.StatusOK, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(member.got())
			st, _, raw := post(t, url+"/v1/chat/completions", tc.headers, chat)
			if st != tc.wantStatus {
				t.Fatalf("status %d %s", st, raw)
			}
			if got := len(member.got()) - before; got != tc.wantMember {
				t.Fatalf("member got %d legs, want %d", got, tc.wantMember)
			}
			if n := len(outsider.got()); n != 0 {
				t.Fatalf("the outsider was dialled %d times", n)
			}
		})
	}
	last := dec.got()[len(dec.got())-1]
	if kv, _ := last.Body["kv_transfer_params"].(map[string]any); kv == nil || kv["remote_kv_source"] != nil {
		t.Fatalf("decode leg %v: an outside KV source must not be injected", last.Body)
	}
	for _, l := range member.got() {
		if _, ok := l.Body["ec_transfer_params"]; ok {
			t.Fatalf("prefill leg carries encoder output from an outside encoder: %v", l.Body)
		}
	}
	if got := counter(t, sc, "kvgate_sidecar_ssrf_denied_total"); got != 7 {
		t.Fatalf("ssrf_denied_total %v, want 7 (5 prefill, 1 encoder, 1 KV source)", got)
	}

	// The pool grows: the outsider becomes a member and is dialled.
	b, _ := staticfile.Marshal([]endpoints.Spec{{Name: "a", Address: member.addr()}, {Name: "b", Address: outsider.addr()}})
	if err := os.WriteFile(pool+".tmp", b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(pool+".tmp", pool); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testTimeout)
	for {
		st, _, _ := post(t, url+"/v1/completions", map[string]string{eppwire.HeaderPrefiller: outsider.addr()}, map[string]any{"model": "m", "prompt": "p"})
		if st == http.StatusOK {
			break
		}
		if st != http.StatusForbidden || time.Now().After(deadline) {
			t.Fatalf("after the pool edit: %d", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(outsider.got()) != 1 {
		t.Fatalf("the new member got %d legs", len(outsider.got()))
	}
}

// TestSSRFOff: with --enable-ssrf-protection=false any target is dialled,
// as llm-d's default does.
func TestSSRFOff(t *testing.T) {
	pre := newRecorder(t, func(w http.ResponseWriter, _ int, _ leg) { writeJSONReply(w, http.StatusOK, prefillAnswer) })
	dec := newRecorder(t, func(w http.ResponseWriter, _ int, _ leg) { writeJSONReply(w, http.StatusOK, map[string]any{}) })
	_, url := startSidecar(t, testOptions(dec.port(), ""))
	if st, _, raw := post(t, url+"/v1/completions", map[string]string{eppwire.HeaderPrefiller: pre.addr()}, map[string]any{"model": "m", "prompt": "p"}); st != http.StatusOK || len(pre.got()) != 1 {
		t.Fatalf("%d %s", st, raw)
	}
}

// With SSRF protection off a client names any prefiller: the P/D pair
// metric keeps the first maxPrefillerLabels as labels and counts the rest
// as "other", so that its series stay bounded.
func TestPrefillerLabelsBounded(t *testing.T) {
	l := labelSet{max: 3}
	got := map[string]bool{}
	for i := range 10 {
		got[l.label(fmt.Sprintf("10.0.0.%d:8000", i))] = true
	}
	if len(got) != 4 || !got[otherPrefiller] || !got["10.0.0.2:8000"] || got["10.0.0.3:8000"] {
		t.Fatalf("labels %v: want the first 3 and %q", got, otherPrefiller)
	}
	if l.label("10.0.0.1:8000") != "10.0.0.1:8000" {
		t.Fatal("a prefiller seen before lost its label")
	}
}
