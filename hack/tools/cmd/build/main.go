// Command build builds helm and promtool into .build/tools (make tools).
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/kproxy/kproxy/hack/tools"
)

func main() {
	for _, name := range []string{"helm", "promtool"} {
		p, err := tools.Ensure(context.Background(), name, log.Printf)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(p)
	}
}
