package endpoints

import "testing"

func TestValidateHostnames(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"gw.cluster-a.example.com:443", true},
		{"10.0.0.1:443", true},
		{"[fd00::1]:443", true},
		{"gw.example.com", false},
		{"gw.example.com:0", false},
		{"Upper.Example:443", false},
		{"under_score:443", false},
		{"[fe80::1%eth0]:443", false},
	} {
		err := Validate([]Spec{{Name: "c", Address: tc.addr, Hostname: true}})
		if (err == nil) != tc.ok {
			t.Errorf("%s: err = %v", tc.addr, err)
		}
	}
	if err := Validate([]Spec{{Name: "c", Address: "gw.example.com:443"}}); err == nil {
		t.Error("a DNS name accepted without Hostname")
	}
	ds := NewDatastore()
	if err := ds.Replace([]Spec{{Name: "c", Address: "gw.example.com:443", Hostname: true}}); err != nil {
		t.Fatal(err)
	}
	if e := ds.Get("c"); e == nil || e.Address() != "gw.example.com:443" {
		t.Fatalf("datastore: %v", e)
	}
}

// A peer cluster is not scraped, so it does not wait for a first scrape.
func TestHostnameSkipsAwaitFirstScrape(t *testing.T) {
	ds := NewDatastoreWith(Config{AwaitFirstScrape: true})
	if err := ds.Replace([]Spec{{Name: "c", Address: "gw.example.com:443", Hostname: true}, {Name: "p", Address: "10.0.0.1:8000"}}); err != nil {
		t.Fatal(err)
	}
	if got := ds.Candidates(); len(got) != 1 || got[0].Name() != "c" {
		t.Fatalf("candidates %v, want the cluster only", got)
	}
}
