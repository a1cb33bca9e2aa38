package nixl

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
)

func sampleMD() *agentMD {
	return &agentMD{Name: "agent-a", Backends: []backendMD{{Type: "UCX", Workers: [][]byte{{1, 2, 3}, {4}},
		Regions: []regionMD{{Type: DRAM, Desc: Desc{Addr: 0x1000, Len: 4096, DevID: 0}, RKey: []byte{9, 9}}}}}}
}

func TestMetadataRoundTrip(t *testing.T) {
	m := sampleMD()
	got, err := decodeMD(m.encode())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.encode(), m.encode()) {
		t.Fatalf("round trip changed the metadata: %+v", got)
	}
}

func TestMetadataRejects(t *testing.T) {
	good := sampleMD().encode()
	for _, tc := range []struct {
		name string
		blob []byte
	}{
		{"empty", nil},
		{"magic", append([]byte("XXXXXXX"), good[7:]...)},
		{"version", append(append([]byte(mdMagic), 9), good[8:]...)},
		{"flipped byte", func() []byte { b := bytes.Clone(good); b[12] ^= 1; return b }()},
		{"truncated", good[:len(good)-1]},
		{"no name", (&agentMD{}).encode()},
		{"zero workers", (&agentMD{Name: "a", Backends: []backendMD{{Type: "UCX"}}}).encode()},
		{"empty worker address", (&agentMD{Name: "a", Backends: []backendMD{{Type: "UCX", Workers: [][]byte{{1}, {}}}}}).encode()},
		{"empty region", (&agentMD{Name: "a", Backends: []backendMD{{Type: "UCX", Workers: [][]byte{{1}},
			Regions: []regionMD{{Desc: Desc{Addr: 1}}}}}}).encode()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decodeMD(tc.blob); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func FuzzDecodeMD(f *testing.F) {
	f.Add(sampleMD().encode())
	f.Add([]byte(mdMagic + "\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMD(b)
		if err != nil {
			return
		}
		if _, err := decodeMD(m.encode()); err != nil {
			t.Fatalf("re-encoded metadata rejected: %v", err)
		}
	})
}

func FuzzParseNotif(f *testing.F) {
	f.Add(notifPayload("agent-a", []byte("req-1:1")))
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		name, msg, ok := parseNotif(b)
		if !ok {
			return
		}
		if n2, m2, ok2 := parseNotif(notifPayload(name, msg)); !ok2 || n2 != name || !bytes.Equal(m2, msg) {
			t.Fatalf("round trip of %q %q", name, msg)
		}
	})
}

// TestHostileWorkerAddress: a peer's worker address reaches ucp_ep_create,
// which reads its format version from the first byte's low four bits and
// aborts the process (a fatal assertion, not an error) on one it does not
// know. Before, metadata with such an address was loaded and the first
// transfer or notification to the peer killed the agent; now it is refused
// at load, and what was loaded under the name before stays usable.
func TestHostileWorkerAddress(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	x, y := newSide(t, "x", 1<<16, nil), newSide(t, "y", 1<<16, nil)
	connect(t, x, y)
	blob, err := y.a.LocalMD()
	if err != nil {
		t.Fatal(err)
	}
	for _, first := range []byte{0xff, 0x02, 0x1f} {
		t.Run(fmt.Sprintf("%#02x", first), func(t *testing.T) {
			md, err := decodeMD(blob)
			if err != nil {
				t.Fatal(err)
			}
			md.Backends[0].Workers[0] = append([]byte{first}, md.Backends[0].Workers[0][1:]...)
			if _, err := x.a.LoadRemoteMD(md.encode()); !errors.Is(err, ErrInvalidParam.Err()) {
				t.Fatalf("hostile metadata: %v, want %v", err, ErrInvalidParam)
			}
			if err := x.a.GenNotif("y", []byte("still there")); err != nil {
				t.Fatalf("the metadata loaded before was replaced: %v", err)
			}
		})
	}
	if got := notifsFrom(t, y.a, "x", 3); len(got) != 3 {
		t.Fatalf("%d notifications arrived, want 3", len(got))
	}
}
