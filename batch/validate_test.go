package batch

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

const chatURL = "/v1/chat/completions"

func chatLine(id, model string) string {
	return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":"/v1/chat/completions","body":{"model":%q,"messages":[]}}`, id, model)
}

func TestParseInput(t *testing.T) {
	type want struct {
		code  string
		line  int
		param string
	}
	for _, tc := range []struct {
		name  string
		input string
		tasks int
		errs  []want
	}{
		{"valid", chatLine("a", "m") + "\n" + chatLine("b", "m2") + "\n", 2, nil},
		{"no trailing newline, blank lines kept out", chatLine("a", "m") + "\n\n  \n" + chatLine("b", "m"), 2, nil},
		{"empty", "", 0, []want{{codeEmptyFile, 0, ""}}},
		{"only blank", "\n \n", 0, []want{{codeEmptyFile, 0, ""}}},
		{"malformed", chatLine("a", "m") + "\n{not json\n", 0, []want{{codeInvalidJSON, 2, ""}}},
		{"array line", "[1,2]\n", 0, []want{{codeInvalidJSON, 1, ""}}},
		{"wrong url", `{"custom_id":"a","method":"POST","url":"/v1/embeddings","body":{"model":"m"}}`, 0, []want{{codeInvalidURL, 1, "url"}}},
		{"wrong method", `{"custom_id":"a","method":"GET","url":"/v1/chat/completions","body":{"model":"m"}}`, 0, []want{{codeInvalidMethod, 1, "method"}}},
		{"no custom_id", `{"method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}`, 0, []want{{codeMissingParam, 1, "custom_id"}}},
		{"no body", `{"custom_id":"a","method":"POST","url":"/v1/chat/completions"}`, 0, []want{{codeMissingParam, 1, "body"}}},
		{"no model", `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{}}`, 0, []want{{codeMissingParam, 1, "body.model"}}},
		{"body not an object", `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":"x"}`, 0, []want{{codeInvalidJSON, 1, "body"}}},
		{"stream", `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","stream":true}}`, 0, []want{{codeStreamNotAllow, 1, "body.stream"}}},
		{"duplicate", chatLine("a", "m") + "\n" + chatLine("b", "m") + "\n" + chatLine("a", "m") + "\n", 0, []want{{codeDuplicateID, 3, "custom_id"}}},
		{"several, in line order", "x\n" + chatLine("a", "m") + "\n" + chatLine("a", "m") + "\n", 0,
			[]want{{codeInvalidJSON, 1, ""}, {codeDuplicateID, 3, "custom_id"}}},
		{"too many", strings.Repeat(chatLine("a", "m")+"\n", 1) + chatLine("b", "m") + "\n" + chatLine("c", "m") + "\n" + chatLine("d", "m") + "\n", 0,
			[]want{{codeTooManyLines, 0, ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tasks, errs, err := parseInput(strings.NewReader(tc.input), chatURL, 3)
			if err != nil {
				t.Fatal(err)
			}
			if len(tasks) != tc.tasks {
				t.Errorf("%d tasks, want %d", len(tasks), tc.tasks)
			}
			if len(errs) != len(tc.errs) {
				t.Fatalf("errors %+v, want %+v", errs, tc.errs)
			}
			for i, w := range tc.errs {
				e := errs[i]
				line := 0
				if e.Line != nil {
					line = *e.Line
				}
				param := ""
				if e.Param != nil {
					param = *e.Param
				}
				if e.Code != w.code || line != w.line || param != w.param || e.Message == "" {
					t.Errorf("error %d: %s line %d param %q (%s), want %+v", i, e.Code, line, param, e.Message, w)
				}
			}
		})
	}
}

// TestReadTask: a task's body comes back from its recorded position.
func TestReadTask(t *testing.T) {
	in := "\n" + chatLine("a", "m1") + "\n" + `{"custom_id":"b","method":"POST","url":"/v1/chat/completions","body":{"model":"m2","x":[1,2]}}`
	tasks, errs, err := parseInput(strings.NewReader(in), chatURL, 10)
	if err != nil || errs != nil || len(tasks) != 2 {
		t.Fatalf("%v %v %v", tasks, errs, err)
	}
	if tasks[0].line != 2 || tasks[1].line != 3 || tasks[1].model != "m2" {
		t.Errorf("tasks %+v", tasks)
	}
	body, err := readTask(strings.NewReader(in), tasks[1])
	if err != nil || string(body) != `{"model":"m2","x":[1,2]}` {
		t.Errorf("body %s %v", body, err)
	}
	if _, err := readTask(strings.NewReader(strings.Replace(in, `"b"`, `"c"`, 1)), tasks[1]); err == nil {
		t.Error("a changed file was read back without an error")
	}
}

func FuzzParseInput(f *testing.F) {
	f.Add([]byte(chatLine("a", "m") + "\n" + chatLine("b", "m")))
	f.Add([]byte("{\"custom_id\":\"a\"}\n\n[]"))
	f.Add([]byte(`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","stream":true}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		tasks, errs, err := parseInput(bytes.NewReader(in), chatURL, 100)
		if err != nil {
			t.Fatal(err)
		}
		if (len(tasks) == 0) == (len(errs) == 0) {
			t.Fatalf("%d tasks and %d errors", len(tasks), len(errs))
		}
		seen := map[string]bool{}
		for _, tk := range tasks {
			if seen[tk.customID] || tk.model == "" {
				t.Fatalf("task %+v", tk)
			}
			seen[tk.customID] = true
			if _, err := readTask(bytes.NewReader(in), tk); err != nil {
				t.Fatalf("read back %+v: %v", tk, err)
			}
		}
	})
}
