// PLACEHOLDER (being written now).
namespace farmem {}
