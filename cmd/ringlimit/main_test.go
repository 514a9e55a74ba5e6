package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestHelpGoesToStdout checks that every way of asking for help prints to
// stdout and exits 0, and that usage errors print to stderr and exit 1.
func TestHelpGoesToStdout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string // in stdout for help, in stderr for errors
	}{
		{"help", []string{"help"}, 0, "ringlimit help [command]"},
		{"--help", []string{"--help"}, 0, "ringlimit help [command]"},
		{"help serve", []string{"help", "serve"}, 0, "--gossip-addr"},
		{"help serve shows the policy file", []string{"help", "serve"}, 0, "Policy file (--policies"},
		{"help check", []string{"help", "check"}, 0, "Exit codes: 0 allowed"},
		{"help demo", []string{"help", "demo"}, 0, "Usage: ringlimit demo"},
		{"help bench", []string{"help", "bench"}, 0, "Usage: ringlimit bench"},
		{"serve -h", []string{"serve", "-h"}, 0, "--gossip-addr"},
		{"bench --help", []string{"bench", "--help"}, 0, "Usage: ringlimit bench"},
		{"check -h", []string{"check", "-h"}, 0, "Exit codes: 0 allowed"},
		{"check -h after other flags", []string{"check", "--addr", "127.0.0.1:1", "-h"}, 0, "Exit codes: 0 allowed"},
		{"help for an unknown command", []string{"help", "nope"}, 1, `unknown command "nope"`},
		{"no command", nil, 1, "Usage:"},
		{"bad check flag", []string{"check", "--bogus"}, 1, "flag provided but not defined: -bogus"},
		{"bad check flag shows usage", []string{"check", "--bogus"}, 1, "Usage: ringlimit check"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := exitCode(run(context.Background(), tc.args, &out, &errOut), &errOut)
			if code != tc.wantCode {
				t.Errorf("run(%q): exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", tc.args, code, tc.wantCode, out.String(), errOut.String())
			}
			want, other, wantName := &out, &errOut, "stdout"
			if tc.wantCode != 0 {
				want, other, wantName = &errOut, &out, "stderr"
			}
			if !strings.Contains(want.String(), tc.wantOut) {
				t.Errorf("run(%q): %s lacks %q\nstdout:\n%s\nstderr:\n%s", tc.args, wantName, tc.wantOut, out.String(), errOut.String())
			}
			if other.Len() != 0 {
				t.Errorf("run(%q): the other stream has output, want none:\n%s", tc.args, other.String())
			}
		})
	}
}
