/* What netperf's `configure --enable-exs` checks: the header is found and
 * exs_init links from -lexs. Run: exit 0 when exs_init(EXS_VERSION) works. */
#include <sys/exs.h>

int main(void) { return exs_init(EXS_VERSION) == 0 ? 0 : 1; }
