package k8s

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/json"
)

func TestObjectivePriority(t *testing.T) {
	tests := []struct {
		name      string
		obj       string
		wantName  string
		wantPrio  int
		wantMatch bool
		wantErr   bool
	}{
		{name: "priority", obj: `{"metadata":{"name":"chat"},"spec":{"priority":10,"poolRef":{"name":"pool"}}}`,
			wantName: "chat", wantPrio: 10, wantMatch: true},
		{name: "negative is sheddable", obj: `{"metadata":{"name":"batch"},"spec":{"priority":-1,"poolRef":{"name":"pool","group":"inference.networking.k8s.io","kind":"InferencePool"}}}`,
			wantName: "batch", wantPrio: -1, wantMatch: true},
		{name: "default 0", obj: `{"metadata":{"name":"d"},"spec":{"poolRef":{"name":"pool"}}}`,
			wantName: "d", wantMatch: true},
		{name: "other pool", obj: `{"metadata":{"name":"o"},"spec":{"priority":3,"poolRef":{"name":"other"}}}`,
			wantName: "o"},
		{name: "other group", obj: `{"metadata":{"name":"o"},"spec":{"priority":3,"poolRef":{"name":"pool","group":"example.com"}}}`,
			wantName: "o"},
		{name: "other kind", obj: `{"metadata":{"name":"o"},"spec":{"priority":3,"poolRef":{"name":"pool","kind":"Service"}}}`,
			wantName: "o"},
		{name: "no poolRef", obj: `{"metadata":{"name":"o"},"spec":{}}`, wantName: "o", wantErr: true},
		{name: "no name", obj: `{"metadata":{},"spec":{"poolRef":{"name":"pool"}}}`, wantErr: true},
		{name: "string priority", obj: `{"metadata":{"name":"s"},"spec":{"priority":"high","poolRef":{"name":"pool"}}}`,
			wantName: "s", wantMatch: true, wantErr: true},
		{name: "fractional priority", obj: `{"metadata":{"name":"f"},"spec":{"priority":1.5,"poolRef":{"name":"pool"}}}`,
			wantName: "f", wantMatch: true, wantErr: true},
		{name: "huge priority", obj: `{"metadata":{"name":"h"},"spec":{"priority":99999999999,"poolRef":{"name":"pool"}}}`,
			wantName: "h", wantMatch: true, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var obj map[string]any
			if err := json.Unmarshal([]byte(tc.obj), &obj); err != nil {
				t.Fatal(err)
			}
			name, prio, match, err := objectivePriority(obj, "pool")
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if name != tc.wantName || prio != tc.wantPrio || match != tc.wantMatch {
				t.Errorf("got (%q, %d, %v), want (%q, %d, %v)", name, prio, match, tc.wantName, tc.wantPrio, tc.wantMatch)
			}
		})
	}
}

// FuzzObjectivePriority decodes arbitrary JSON the way the API machinery
// does and reads it as an InferenceObjective: it must never panic, and a
// matching objective always has a name.
func FuzzObjectivePriority(f *testing.F) {
	for _, s := range []string{
		`{"metadata":{"name":"chat"},"spec":{"priority":10,"poolRef":{"name":"pool"}}}`,
		`{"metadata":{"name":"x"},"spec":{"priority":1e300,"poolRef":{"name":"pool"}}}`,
		`{"metadata":{"name":7},"spec":[]}`,
		`{"metadata":null}`,
		`{"spec":{"poolRef":"pool"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var obj map[string]any
		if json.Unmarshal(data, &obj) != nil {
			return
		}
		name, _, match, err := objectivePriority(obj, "pool")
		if err == nil && match && name == "" {
			t.Fatal("matching objective without a name")
		}
	})
}
