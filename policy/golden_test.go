package policy

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the current decisions")

// TestGolden plays every testdata/scenarios/*.json and compares the decisions
// (choice, reason and every candidate's score parts) with
// testdata/golden/<name>.json. Regenerate with go test ./policy -run Golden -update.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/scenarios/*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scenarios in testdata/scenarios")
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			s, err := parseScenario(b)
			if err != nil {
				t.Fatalf("parse %s: %v", f, err)
			}
			got, err := s.run()
			if err != nil {
				t.Fatalf("run %s: %v", f, err)
			}
			gotJSON, err := json.MarshalIndent(got, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			gotJSON = append(gotJSON, '\n')
			golden := filepath.Join("testdata", "golden", name+".json")
			if *update {
				if err := os.WriteFile(golden, gotJSON, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(gotJSON, want) {
				t.Errorf("decisions differ from %s (run with -update after checking):\ngot:\n%s\nwant:\n%s", golden, gotJSON, want)
			}
		})
	}
}
