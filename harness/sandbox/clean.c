/* The self-test's clean library: what an honest candidate does on the host, which the sandbox must
 * leave working. Its constructor runs at load time; astra_clean_value() is called after the worker has
 * locked executable mappings, and returns 42 when the constructor ran too. */
static int constructed;

__attribute__((constructor)) static void astra_clean_constructor(void) { constructed = 1; }

int astra_clean_value(void) { return constructed ? 42 : -1; }
