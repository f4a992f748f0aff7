// PLACEHOLDER (being written now).
int main() { return 1; }
