// SseParser: incremental parser of a text/event-stream body (Server-Sent Events), as OpenAI
// streaming responses send them ("data: {...}\n\n" ... "data: [DONE]\n\n").
//
// Bytes may be split anywhere (inside a line, between '\r' and '\n', inside a UTF-8 sequence);
// the parser keeps the unfinished line and the unfinished event across feed() calls. It follows
// the WHATWG rules for the fields it needs: lines end in "\r\n", "\n" or "\r"; a blank line ends
// an event; the data of several "data:" lines is joined with '\n'; one space after the colon is
// dropped; comments (":...") and the fields event/id/retry are ignored; an event with no data
// is not dispatched. Unlike a browser, finish() dispatches an event left without its closing
// blank line when the body ends, since some servers close the stream right after "data: [DONE]".
#pragma once

#include <string>
#include <string_view>

namespace vesper::client {

class SseParser {
 public:
  // Parses `bytes`; calls on_event(std::string_view data) for each event completed by them.
  template <class OnEvent>
  void feed(std::string_view bytes, OnEvent&& on_event) {
    for (char c : bytes) {
      if (after_cr_) {
        after_cr_ = false;
        if (c == '\n') continue;  // the '\n' of a "\r\n" split across feeds or not
      }
      if (c == '\r' || c == '\n') {
        after_cr_ = c == '\r';
        end_line(on_event);
      } else {
        line_.push_back(c);
      }
    }
  }

  // The body ended: completes a last line and event that lack their terminators.
  template <class OnEvent>
  void finish(OnEvent&& on_event) {
    if (!line_.empty()) end_line(on_event);
    end_line(on_event);  // a blank line: dispatches the pending event, if any
    after_cr_ = false;
    bom_checked_ = false;
  }

 private:
  template <class OnEvent>
  void end_line(OnEvent&& on_event) {
    std::string_view line = line_;
    if (!bom_checked_) {
      bom_checked_ = true;
      if (line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);
    }
    if (line.empty()) {
      if (!data_.empty()) {
        data_.pop_back();  // the '\n' after the last data line
        on_event(std::string_view(data_));
        data_.clear();
      }
    } else if (line.front() != ':') {
      const size_t colon = line.find(':');
      const std::string_view field = line.substr(0, colon);
      std::string_view value =
          colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      if (field == "data") {
        data_.append(value);
        data_.push_back('\n');
      }
    }
    line_.clear();
  }

  std::string line_;  // the line being read, without its terminator
  std::string data_;  // the data lines of the event being read, each followed by '\n'
  bool after_cr_ = false;
  bool bom_checked_ = false;
};

}  // namespace vesper::client
