// Unit tests of the Jinja interpreter (src/text/jinja*.cpp): constructs, printing, whitespace
// control, errors with positions, and the limits that keep hostile templates bounded. The
// byte-for-byte comparison with python3-jinja2 lives in test_chat_template.cpp.
#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "text/jinja.h"

using glms::jinja::RenderLimits;
using glms::jinja::Template;
using glms::jinja::Value;

namespace {

std::string render(const std::string& src, const std::string& context_json = "{}",
                   const RenderLimits& limits = {}) {
  return Template::parse(src).render(Value::from_json(context_json), limits);
}

// The message of the glms::Error that rendering `src` throws ("" if none).
std::string error_of(const std::string& src, const std::string& context_json = "{}",
                     const RenderLimits& limits = {}) {
  try {
    render(src, context_json, limits);
  } catch (const glms::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Jinja, TextAndExpressions) {
  EXPECT_EQ(render("Hello {{ name }}!", R"({"name": "world"})"), "Hello world!");
  EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 8 }}"),
            "7 9 3 -4 1 256");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }} {{ 'ab' * 2 }} {{ [1] + [2] }}"), "a1None abab [1, 2]");
  // Integer powers by squaring: a huge exponent of 1, 0 or -1 is quick (fuzzing found a template
  // that looped 33 billion times); a result past 64 bits is an error.
  EXPECT_EQ(render("{{ 3 ** 0 }} {{ 3 ** 13 }} {{ -2 ** 3 }} {{ (-2) ** 63 }} {{ 1 ** 33333333333 }} "
                   "{{ (-1) ** 33333333333 }} {{ 0 ** 33333333333 }} {{ true ** 33333333333 }}"),
            "1 1594323 -8 -9223372036854775808 1 -1 0 1");
  EXPECT_NE(error_of("{{ 2 ** 64 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ 3 ** 41 }}").find("integer overflow"), std::string::npos);
  EXPECT_EQ(render("{{ 'x' if flag else 'y' }}{{ 'z' if not flag }}", R"({"flag": false})"), "yz");
}

TEST(Jinja, PythonPrinting) {
  EXPECT_EQ(render("{{ true }} {{ false }} {{ none }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 10 / 4 }}"),
            "True False None 1.0 0.30000000000000004 1e+20 1e-05 2.5");
  EXPECT_EQ(render("{{ ['a', 1, none, true, 2.5] }} {{ {'k': 'v'} }} {{ (1,) }} {{ ('a', 'b') }}"),
            "['a', 1, None, True, 2.5] {'k': 'v'} (1,) ('a', 'b')");
  EXPECT_EQ(render(R"({{ ["it's"] }} {{ ['say "hi"'] }} {{ ['a\nb\\'] }})"),
            R"(["it's"] ['say "hi"'] ['a\nb\\'])");
  EXPECT_EQ(glms::jinja::float_repr(123456789012345678.0), "1.2345678901234568e+17");
  EXPECT_EQ(glms::jinja::float_repr(1e16), "1e+16");
  EXPECT_EQ(glms::jinja::float_repr(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(glms::jinja::float_repr(0.0001), "0.0001");
}

TEST(Jinja, Undefined) {
  EXPECT_EQ(render("[{{ missing }}]{{ missing is defined }}{{ d.nope is defined }}{{ missing | default('x') }}",
                   R"({"d": {}})"),
            "[]FalseFalsex");
  EXPECT_EQ(render("{% for x in missing %}a{% else %}empty{% endfor %}{{ missing | length }}"), "empty0");
  EXPECT_EQ(error_of("{{ missing.attr }}"), "template error at line 1: 'missing' is undefined");
  EXPECT_EQ(error_of("\n{{ d.a.b }}", R"({"d": {}})"),
            "template error at line 2: 'dict object' has no attribute 'a'");
  EXPECT_EQ(error_of("{{ missing() }}"), "template error at line 1: 'missing' is undefined");
}

TEST(Jinja, WhitespaceControl) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before it goes.
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif %}  c"), "ab  c");
  EXPECT_EQ(render("a\n  {{- 'x' -}}  \nb"), "axb");
  EXPECT_EQ(render("  {{ 'v' }}\n"), "  v");  // lstrip does not apply to {{ }}; final \n dropped
  EXPECT_EQ(render("{%+ if true %}x{% endif %}"), "x");
  EXPECT_EQ(render("  {%+ if true %}x{% endif +%}\ny"), "  x\ny");
  EXPECT_EQ(render("a{# note #}\nb"), "ab");
  EXPECT_EQ(render("x\r\ny"), "x\ny");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(Jinja, Loops) {
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}",
                   R"({"xs": ["a", "b"]})"),
            "1a,2b");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", R"({"d": {"b": 1, "a": 2}})"),
            "b=1;a=2;");
  EXPECT_EQ(render("{% for x in range(10) if x is even %}{% if x > 5 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "024");
  EXPECT_EQ(render("{% for x in range(4) %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}"), "023");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for x in range(5) %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}"),
            "10");
  EXPECT_EQ(render("{% set n = 0 %}{% for x in range(5) %}{% set n = n + x %}{% endfor %}{{ n }}"), "0");
}

TEST(Jinja, MacrosAndBlocks) {
  EXPECT_EQ(render("{% macro f(a, b='d') %}{{ a }}-{{ b }}{% endmacro %}{{ f(1) }} {{ f(1, 2) }} {{ f(b=3, a=4) }}"),
            "1-d 1-2 4-3");
  EXPECT_EQ(render("{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}in{% endcall %}"), "<in>");
  EXPECT_EQ(render("{% set x %}a{{ 1 }}{% endset %}{{ x }}{% filter upper %}b{% endfilter %}"), "a1B");
}

TEST(Jinja, FiltersAndMethods) {
  EXPECT_EQ(render("{{ d | tojson }}", R"({"d": {"a": [1, 2.0, "é\n"], "b": null}})"),
            "{\"a\": [1, 2.0, \"é\\n\"], \"b\": null}");
  EXPECT_EQ(render("{{ d | tojson(indent=2) }}", R"({"d": {"a": [1]}})"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ xs | map(attribute='n') | join(',') }} {{ xs | selectattr('n', 'gt', 1) | list | length }}",
                   R"({"xs": [{"n": 1}, {"n": 2}]})"),
            "1,2 1");
  EXPECT_EQ(render("{{ ' a '.strip() }}|{{ 'a,b'.split(',') }}|{{ 'abc'.startswith('ab') }}|{{ 'Héllo'|upper }}"),
            "a|['a', 'b']|True|HÉLLO");
  EXPECT_EQ(render("{{ 'ünï'[1:] }} {{ 'ünï' | length }} {{ 'abc'[::-1] }}"), "nï 3 cba");
}

TEST(Jinja, RaiseException) {
  try {
    render("{{ raise_exception('no system messages') }}");
    FAIL();
  } catch (const glms::jinja::RaisedError& e) {
    EXPECT_STREQ(e.what(), "no system messages");
  }
}

TEST(Jinja, SandboxRefusesMutation) {
  EXPECT_NE(error_of("{% set l = [] %}{{ l.append(1) }}").find("unsafe"), std::string::npos);
  EXPECT_NE(error_of("{{ range(1000001) | length }}").find("Range too big"), std::string::npos);
}

TEST(Jinja, SyntaxErrorsHavePositions) {
  EXPECT_EQ(error_of("ab\n  {% for x in xs %}{{ x }}"),
            "template syntax error at 2:27: expected 'endfor' or 'else', got end of template");
  EXPECT_EQ(error_of("{% if x %}{% endfor %}"),
            "template syntax error at 1:14: unknown tag 'endfor'");
  EXPECT_EQ(error_of("{{ 1 + }}"), "template syntax error at 1:8: expected an expression, got '}}'");
  EXPECT_EQ(error_of("x\n{{ 'abc }}"), "template syntax error at 2:4: unterminated string literal");
  EXPECT_EQ(error_of("{{ (1, 2 }}"), "template syntax error at 1:10: unexpected '}'");
  EXPECT_EQ(error_of("{% include 'x' %}"), "template syntax error at 1:4: the 'include' tag is not supported");
  EXPECT_EQ(error_of("{{ x | nofilter }}"), "template syntax error at 1:8: no filter named 'nofilter'");
  EXPECT_EQ(error_of("{{ x is notatest }}"), "template syntax error at 1:9: no test named 'notatest'");
}

TEST(Jinja, RuntimeErrorsNameTheLine) {
  EXPECT_EQ(error_of("a\nb\n{{ 1 + 'x' }}"),
            "template error at line 3: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(error_of("{% for x in xs %}\n{{ x / 0 }}{% endfor %}", R"({"xs": [1]})"),
            "template error at line 2: division by zero");
}

TEST(Jinja, LimitsBoundHostileTemplates) {
  RenderLimits small;
  small.max_steps = 10000;
  EXPECT_NE(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "{}", small)
                .find("step limit"),
            std::string::npos);
  EXPECT_NE(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("macro call depth"),
            std::string::npos);
  RenderLimits tiny_output;
  tiny_output.max_output_bytes = 1000;
  EXPECT_NE(error_of("{% for i in range(1000) %}xxxxxxxxxx{% endfor %}", "{}", tiny_output).find("output exceeds"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 1000000000 }}").find("too large"), std::string::npos);
  // Empty sequences repeat at once (fuzz_chat_template: `27 ** 7 * []` looped 10^10 times, 12 s),
  // and a count whose product with the size would wrap 64 bits is still too large.
  EXPECT_EQ(render("{{ 27 ** 7 * [] }} {{ '' * 10000000000 }}|{{ (1, 2) * 0 }}"), "[] |()");
  EXPECT_NE(error_of("{{ 'ab' * 9223372036854775807 }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{{ [1, 2] * 9223372036854775807 }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nested too deeply"),
            std::string::npos);
  std::string nested;
  for (int i = 0; i < 500; ++i) nested += "{% if true %}";
  EXPECT_NE(error_of(nested).find("nested too deeply"), std::string::npos);
}

TEST(Jinja, GarbageNeverCrashes) {
  // Every prefix of a realistic template either renders or throws glms::Error.
  const std::string src =
      "{%- set ns = namespace(x=[]) -%}{% for m in messages if m.role != 'x' %}{{- '<|' ~ m.role ~ '|>' -}}"
      "{% if m.content is string %}{{ m.content | trim }}{% else %}{{ m.content | tojson(indent=2) }}{% endif %}"
      "{% set ns.x = ns.x + [loop.index] %}{% endfor %}{{ ns.x[::-1] | join(',') }}{# end #}";
  const std::string ctx = R"({"messages": [{"role": "user", "content": "hi"}, {"role": "a", "content": [1]}]})";
  for (size_t n = 0; n <= src.size(); ++n) {
    try {
      render(src.substr(0, n), ctx);
    } catch (const glms::Error&) {
    }
  }
  EXPECT_EQ(render(src, ctx), "<|user|>hi<|a|>[\n  1\n]2,1");
}

TEST(Jinja, ConcurrentRenders) {
  Template t = Template::parse("{% for i in range(n) %}{{ i }}{% endfor %}");
  std::vector<std::thread> threads;
  std::vector<std::string> out(4);
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] { out[k] = t.render(Value::from_json("{\"n\": 50}")); });
  for (auto& th : threads) th.join();
  for (int k = 1; k < 4; ++k) EXPECT_EQ(out[k], out[0]);
}
