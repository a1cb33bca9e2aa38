package mooncake

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestReadFractionalTimestamps(t *testing.T) {
	recs, err := Read(strings.NewReader(`{"timestamp": 0.25, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]}

{"timestamp": 1500.5, "input_length": 10, "output_length": 1}
`), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Arrival() != 250*time.Microsecond || recs[1].Arrival() != 1500500*time.Microsecond {
		t.Fatalf("records %+v", recs)
	}
	if recs[0].Digest == recs[1].Digest || len(recs[0].HashIDs) != 2 || recs[1].HashIDs != nil {
		t.Fatalf("records %+v", recs)
	}
}

func TestReadLimitAndErrors(t *testing.T) {
	two := `{"timestamp": 0, "input_length": 1, "output_length": 1}` + "\n" + `{"timestamp": 1, "input_length": 1, "output_length": 1}`
	if recs, err := Read(strings.NewReader(two), 1); err != nil || len(recs) != 1 {
		t.Fatalf("limit 1: %d records, %v", len(recs), err)
	}
	for _, bad := range []string{
		`{"timestamp": 5, "output_length": 1}`,
		`{"timestamp": -0.5, "input_length": 1, "output_length": 1}`,
		`{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [-1]}`,
		`{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [` + strings.Repeat("1,", MaxHashIDs) + `1]}`,
		`not json`,
	} {
		if _, err := Read(strings.NewReader(bad), 0); !errors.Is(err, ErrTrace) {
			t.Errorf("%.60s: err = %v, want ErrTrace", bad, err)
		}
	}
}
