package cache

import (
	"math/rand/v2"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The fast name checks agree with the API server's rules on names built
// from the characters that matter (and on long ones).
func TestFastNameRulesAgree(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	const alphabet = "az09-.A_é\n"
	names := []string{"", "a", "-", "a-", "-a", "a.b", "a..b", ".a", "a.", "a-b.c-d", strings.Repeat("a", 63), strings.Repeat("a", 64),
		strings.Repeat("a.", 126) + "a", strings.Repeat("a.", 127) + "a", strings.Repeat("b", 70) + ".c"}
	for range 20000 {
		var b strings.Builder
		for range 1 + rnd.IntN(8) {
			b.WriteByte(alphabet[rnd.IntN(len(alphabet))])
		}
		names = append(names, b.String())
	}
	for _, n := range names {
		if got, want := len(dnsLabel(n)) == 0, len(validation.IsDNS1123Label(n)) == 0; got != want {
			t.Errorf("label %q: valid %v, the API server's rule says %v", n, got, want)
		}
		if got, want := len(dnsSubdomain(n)) == 0, len(validation.IsDNS1123Subdomain(n)) == 0; got != want {
			t.Errorf("subdomain %q: valid %v, the API server's rule says %v", n, got, want)
		}
	}
}
