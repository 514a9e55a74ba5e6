package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// Limits on the repository's markdown (issue 55, "docs that fit in a
// head"): the top-level README stays a page, no README grows past what a
// reader holds in mind.
const (
	topReadmeMaxLines = 150
	readmeMaxLines    = 400
	headlineFigures   = 5
)

// repoDocs returns the repository's markdown files, relative to its root,
// with the root's path.
func repoDocs(t *testing.T) (root string, files []string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no markdown files under %s", root)
	}
	return root, files
}

// TestDocsFit: README.md at most 150 lines, every other markdown file at
// most 400.
func TestDocsFit(t *testing.T) {
	t.Parallel()
	root, files := repoDocs(t)
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Count(string(data), "\n")
		limit := readmeMaxLines
		if f == "README.md" {
			limit = topReadmeMaxLines
		}
		if lines > limit {
			t.Errorf("%s has %d lines, more than %d: move detail to the package READMEs, drop history (git log keeps it)", f, lines, limit)
		}
	}
}

// mdLink matches a markdown link's target: ](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// machinePath matches absolute paths of one machine's file system.
var machinePath = regexp.MustCompile(`(^|[\s("'=])/(work|home|root|Users)/`)

// TestDocsLinks: every relative link in the repository's markdown names a
// file of the repository and, when it has one, a heading of that file;
// no document names a path of one machine.
func TestDocsLinks(t *testing.T) {
	t.Parallel()
	root, files := repoDocs(t)
	headings := map[string]map[string]bool{}
	slugsOf := func(rel string) map[string]bool {
		if h, ok := headings[rel]; ok {
			return h
		}
		data, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		h := map[string]bool{}
		for _, line := range proseLines(string(data)) {
			if m := regexp.MustCompile(`^#+\s+(.*)$`).FindStringSubmatch(line); m != nil {
				h[slug(m[1])] = true
			}
		}
		headings[rel] = h
		return h
	}
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if machinePath.MatchString(line) {
				t.Errorf("%s names a machine's path: %q", f, line)
			}
		}
		for _, line := range proseLines(string(data)) {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				rel := f
				if path != "" {
					rel = filepath.Clean(filepath.Join(filepath.Dir(f), path))
					if strings.HasPrefix(rel, "..") {
						t.Errorf("%s links outside the repository: %s", f, target)
						continue
					}
					if _, err := os.Stat(filepath.Join(root, rel)); err != nil {
						t.Errorf("%s links to %s, which does not exist", f, target)
						continue
					}
				}
				if anchor != "" && strings.HasSuffix(rel, ".md") && !slugsOf(rel)[anchor] {
					t.Errorf("%s links to %s, but %s has no heading #%s", f, target, rel, anchor)
				}
			}
		}
	}
}

// TestHeadlineFigures: README.md's headline figures table keeps five rows,
// numbered 1 to 5, and each number has its command in the block below it.
func TestHeadlineFigures(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	i := strings.Index(s, "\n## Headline figures\n")
	if i < 0 {
		t.Fatal("README.md has no ## Headline figures section")
	}
	section := s[i+1:]
	if j := strings.Index(section[1:], "\n## "); j >= 0 {
		section = section[:j+1]
	}
	rows := regexp.MustCompile(`(?m)^\| (\d+) \|`).FindAllStringSubmatch(section, -1)
	if len(rows) != headlineFigures {
		t.Fatalf("README.md's headline figures table has %d numbered rows, want %d:\n%s", len(rows), headlineFigures, section)
	}
	for k, r := range rows {
		want := string(rune('1' + k))
		if r[1] != want {
			t.Errorf("headline figure row %d is numbered %s, want %s", k+1, r[1], want)
		}
		if !regexp.MustCompile(`(?m)^[^|#].*\s# ` + want + `\b`).MatchString(section) {
			t.Errorf("headline figure %s has no command line ending in \"# %s\"", want, want)
		}
	}
}

// proseLines returns the lines of a markdown document outside its fenced
// code blocks.
func proseLines(doc string) []string {
	var out []string
	in := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			in = !in
			continue
		}
		if !in {
			out = append(out, line)
		}
	}
	return out
}

// slug is a heading's anchor as GitHub makes it: lower case, spaces as
// hyphens, every character but letters, digits, hyphens and underscores
// dropped.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
